"""Registries of named models, hparams sets, optimizers, problems and batch plans.

Registration is explicit: `t2t_lite/__init__.py` imports every registering module, so a
name either exists as soon as the package is imported or it does not exist at all (T2T
lost hours of users' time to registrations that silently never ran). An unknown name is
a one-line error listing what exists and suggesting the closest name.
"""

import difflib

from t2t_lite.errors import UserError


class RegistryError(UserError, KeyError):
    """Unknown or duplicate name; str() is the one-line message."""

    def __str__(self):
        return self.args[0]


class Registry:
    """A name → object mapping for one kind of thing ("model", "problem", ...)."""

    def __init__(self, kind):
        self.kind = kind
        self._entries = {}

    def register(self, name=None):
        """Decorator: `@MODELS.register()` or `@MODELS.register("name")`."""

        def decorator(obj):
            self.add(name or obj.__name__, obj)
            return obj

        return decorator

    def add(self, name, obj):
        if name in self._entries:
            raise RegistryError(f"{self.kind} '{name}' is registered twice.")
        self._entries[name] = obj

    def get(self, name):
        if name in self._entries:
            return self._entries[name]
        suggestion = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" Did you mean '{suggestion[0]}'?" if suggestion else ""
        raise RegistryError(
            f"Unknown {self.kind} '{name}'.{hint} "
            f"Registered: {', '.join(self.names()) or '(none)'}."
        )

    def names(self):
        return sorted(self._entries)

    def __contains__(self, name):
        return name in self._entries


MODELS = Registry("model")
HPARAMS_SETS = Registry("hparams set")
OPTIMIZERS = Registry("optimizer")
PROBLEMS = Registry("problem")
# batch_size_schedule kinds: name → parser(body, text, micro_batch_tokens) → BatchPlan
BATCH_PLANS = Registry("batch plan")
ALL = (MODELS, HPARAMS_SETS, OPTIMIZERS, PROBLEMS, BATCH_PLANS)


def help_text():
    """What `t2t-trainer --registry_help` prints."""
    lines = []
    for registry in ALL:
        lines.append(f"{registry.kind}s:")
        lines.extend(f"  {name}" for name in registry.names())
    return "\n".join(lines)
