"""batch_size_schedule=adaptive:MIN,MAX[,EVERY]: tokens per update that follow the
measured gradient noise scale (training/noise_scale.py, docs/design.md §2.8).

The run starts at MIN tokens per update. Every EVERY updates (default 100) it decides
once: the new target is the noise scale B_simple, but never below the current target
(the batch never shrinks), at most twice it (one decision cannot jump far on a noisy
estimate) and never above MAX. The target and the update of the last decision are
variables in the checkpoint, so a resumed run continues with the same target and makes
the decisions an uninterrupted run would.
"""

import math

import tensorflow as tf

DEFAULT_EVERY = 100


class AdaptiveWindows:
    """The window plan whose token target is decided from the noise scale."""

    constant = False
    kind = "adaptive"

    def __init__(self, text, minimum, maximum, every, micro_batch_tokens):
        self.text, self.every = text, every
        self.minimum, self.maximum = minimum, maximum
        self.micro_batch_tokens = micro_batch_tokens
        self.points = ((0, minimum), (0, maximum))  # for the parser's range check
        self.state = None  # the checkpointed variables, made by create_state()

    def create_state(self):
        """The target and the last decision's update, as variables; call under the
        run's strategy scope (training/build.py does)."""
        self.state = tf.Module(name="adaptive_batch")
        with self.state.name_scope:
            self.state.target = _int_variable(self.minimum, "target_tokens")
            self.state.decided_at = _int_variable(0, "decided_at")
        return self.state

    @property
    def target(self):
        """Tokens per update now: MIN until the state exists (a plan only read,
        e.g. for the start-up line)."""
        if self.state is None:
            return self.minimum
        return int(tf.convert_to_tensor(self.state.target))

    def size(self, update):
        del update
        return max(1, math.ceil(self.target / self.micro_batch_tokens - 1e-9))

    def tokens(self, update):
        return self.size(update) * self.micro_batch_tokens

    def train_updates(self, train_steps):
        """Unknown in advance: the count at MIN, an upper bound. linear_decay is
        refused with an adaptive batch (hparams_checks.py), so no built-in factor
        reads it."""
        return train_steps / max(1, math.ceil(self.minimum / self.micro_batch_tokens))

    def decide(self, update, noise_scale):
        """At a decision update, the new target from `noise_scale` (tokens, None if
        not measured yet); returns (old, new) tokens when it decided, else None."""
        if update == 0 or update % self.every:
            return None
        if int(tf.convert_to_tensor(self.state.decided_at)) >= update:
            return None  # decided before the checkpoint this run resumed from
        old = self.target
        new = old
        if noise_scale is not None and math.isfinite(noise_scale):
            new = int(min(self.maximum, max(old, min(2 * old, noise_scale))))
        self.state.target.assign(new)
        self.state.decided_at.assign(update)
        return old, new

    def describe(self):
        return (
            f"batch_size_schedule {self.text} (from {self.minimum} tokens per update, "
            f"toward the noise scale every {self.every} updates, at most "
            f"{self.maximum})"
        )


def _int_variable(value, name):
    return tf.Variable(
        value,
        dtype=tf.int64,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
