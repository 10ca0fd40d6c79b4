"""HParams: a locked set of declared, typed hyperparameters.

Every key is declared once (with its type fixed by its default value) in the base
hparams set; derived sets and overrides ("a=1,b=2") can only change values, never add
keys. This is ml_collections' locked ConfigDict idea, and the cure for T2T's
`add_hparam` sprawl where a typo silently created a new, unused hyperparameter.
"""

import difflib
import json
import math

from t2t_lite.errors import UserError

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


class HParamsError(UserError):
    """A user-facing error about hyperparameters; its message is one line."""


def _closest(name, candidates):
    match = difflib.get_close_matches(name, list(candidates), n=1)
    return f" Did you mean '{match[0]}'?" if match else ""


def coerce_value(key, value, kind):
    """Converts `value` (a string or a Python value) to `kind`, or raises HParamsError."""
    if isinstance(value, str):
        return _parse_text(key, value, kind)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not kind:  # bool is an int subclass: compare exactly.
        raise HParamsError(
            f"hparam '{key}' expects type {kind.__name__}, got "
            f"{value!r} ({type(value).__name__})."
        )
    return _finite(key, value) if kind is float else value


def _parse_text(key, value, kind):
    """`value`, a string from --hparams or a file, as `kind`."""
    text = value.strip()
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
    elif kind is int:
        try:
            return int(text)
        except ValueError:
            pass
    elif kind is float:
        try:
            number = float(text)
        except ValueError:
            number = None
        if number is not None:
            return _finite(key, number)
    elif kind is str:
        return text
    raise HParamsError(f"hparam '{key}' expects type {kind.__name__}, got '{value}'.")


def _finite(key, value):
    """NaN and Inf parse as floats but are never a meaningful hyperparameter."""
    if not math.isfinite(value):
        raise HParamsError(f"hparam '{key}' must be a finite number, got {value}.")
    return value


class HParams:
    """Declared hyperparameters with attribute access.

    `declare()` is used only by the base set; everything else goes through `set()`,
    `override()` or `parse()`, which refuse undeclared keys and wrong types.
    """

    def __init__(self, **declared):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_types", {})
        for key, value in declared.items():
            self.declare(key, value)

    def declare(self, key, default):
        if key in self._values:
            raise HParamsError(f"hparam '{key}' is declared twice.")
        if hasattr(type(self), key) or key.startswith("_"):
            raise HParamsError(f"hparam name '{key}' is reserved by HParams.")
        if type(default) not in (bool, int, float, str):
            raise HParamsError(f"hparam '{key}' must be bool, int, float or str.")
        self._values[key] = default
        self._types[key] = type(default)

    def __getattr__(self, key):
        values = object.__getattribute__(self, "_values")
        if key in values:
            return values[key]
        raise AttributeError(f"Unknown hparam '{key}'.{_closest(key, values)}")

    def __setattr__(self, key, value):
        self.set(key, value)

    def __contains__(self, key):
        return key in self._values

    def __eq__(self, other):
        return isinstance(other, HParams) and self.values() == other.values()

    def set(self, key, value):
        if key not in self._values:
            raise HParamsError(f"Unknown hparam '{key}'.{_closest(key, self._values)}")
        self._values[key] = coerce_value(key, value, self._types[key])

    def override(self, **values):
        for key, value in values.items():
            self.set(key, value)
        return self

    def parse(self, text, name="hparams"):
        """Applies overrides written as "a=1,b=0.5,c=true,d=name" and returns self.

        `name` is what the caller calls `text` (the argument it came from); every
        error starts with it: "hparams: Unknown hparam 'x'."."""
        try:
            for key, value in parse_overrides(text).items():
                self.set(key, value)
        except HParamsError as e:
            raise HParamsError(f"{name}: {e}") from None
        return self

    def copy(self):
        other = HParams()
        other._values.update(self._values)
        other._types.update(self._types)
        return other

    def values(self):
        return dict(self._values)

    def to_json(self):
        return json.dumps(self._values, indent=2, sort_keys=True)

    def diff(self, other):
        """Keys whose values differ between self and other (union of keys)."""
        mine, theirs = self.values(), other.values()
        return sorted(
            k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)
        )

    @classmethod
    def from_json(cls, text):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise HParamsError(f"hparams JSON is malformed: {e}") from None
        if not isinstance(values, dict):
            raise HParamsError("hparams JSON must be an object of key: value.")
        hp = cls()
        for key, value in values.items():
            hp.declare(key, value)
        return hp

    def __repr__(self):
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items()))
        return f"HParams({items})"


def _pieces(text):
    """text split at commas, except a comma followed by a digit, which continues
    the value before it: no hparam name starts with a digit, and values such as
    batch_size_schedule's linear:8192,65536,2000 or steps:0=8192,1000=32768 hold
    commas."""
    pieces = []
    for piece in text.split(","):
        if pieces and piece[:1].isdigit():
            pieces[-1] += "," + piece
        else:
            pieces.append(piece)
    return pieces


def parse_overrides(text):
    """Splits "a=1,b=x" into {"a": "1", "b": "x"}; values stay strings (a comma
    followed by a digit stays in the value, see _pieces).

    Raises HParamsError naming the offending piece for empty keys, missing '=' or a key
    given twice.
    """
    result = {}
    if not text or not text.strip():
        return result
    for piece in _pieces(text):
        if not piece.strip():
            continue
        key, sep, value = piece.partition("=")
        key = key.strip()
        if not sep or not key:
            raise HParamsError(
                f"expected 'name=value', got '{piece.strip()}' in '{text}'."
            )
        if key in result:
            raise HParamsError(f"'{key}' is given twice in '{text}'.")
        result[key] = value
    return result
