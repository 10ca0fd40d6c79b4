"""batch_size_schedule=adaptive:MIN,MAX[,EVERY[,FRACTION]] (or `adaptive`: from two
micro-batches to 64): tokens per update that follow the measured gradient noise scale
(training/step/noise_scale.py, docs/design.md §2.8).

The run starts at MIN tokens per update. Every EVERY updates (default 100) it decides
once: the new target is FRACTION (default 1) times the noise scale B_simple, but never
below the current target (the batch never shrinks), at most twice it (one decision
cannot jump far on a noisy estimate) and never above MAX. The target and the update of
the last decision are variables in the checkpoint, so a resumed run continues with the
same target and makes the decisions an uninterrupted run would.

Why a fraction: at B = B_simple an update needs about twice the tokens a very small
batch would for the same progress, and half the updates a very large one would
(McCandlish et al. 2018): the balance for hardware on which updates cost the time.
When the batch comes from accumulation on fixed hardware, tokens cost the time
instead, and a target below the noise scale spends fewer of them per unit of progress.
"""

import math
import sys

import tensorflow as tf

from t2t_lite.hparams import HParamsError
from t2t_lite.optim.batch_plan import BatchPlan, BatchPlanError, register_batch_plan
from t2t_lite.state_variables import first_replica_variable

DEFAULT_EVERY = 100
# `adaptive` alone: from the smallest window whose noise scale can be measured up to
# 64 micro-batches (transformer_base's 4096 tokens: 8k to 262k tokens per update)
DEFAULT_MIN_MICRO_BATCHES, DEFAULT_MAX_MICRO_BATCHES = 2, 64


class AdaptiveWindows(BatchPlan):
    """The batch plan whose token target is decided from the noise scale."""

    kind = "adaptive"
    needs_noise_scale = True

    def __init__(
        self,
        text,
        minimum,
        maximum,
        every,
        micro_batch_tokens,
        relative=False,
        fraction=1.0,
    ):
        """relative: MIN and MAX were given in micro-batches (`adaptive` alone), so
        they follow the micro-batch (batch_size=0 resolves it after parsing).
        fraction: the target is this times the noise scale."""
        super().__init__(text, micro_batch_tokens)
        self.every, self.fraction = every, fraction
        self.minimum, self.maximum = minimum, maximum
        self.relative = relative

    @classmethod
    def in_micro_batches(cls, text, micro_batch_tokens):
        """The kind written alone: from two micro-batches to 64 (of whatever size
        batch_size=0 resolves), deciding every DEFAULT_EVERY updates."""
        return cls(
            text,
            DEFAULT_MIN_MICRO_BATCHES * micro_batch_tokens,
            DEFAULT_MAX_MICRO_BATCHES * micro_batch_tokens,
            DEFAULT_EVERY,
            micro_batch_tokens,
            relative=True,
        )

    def create_state(self):
        """The target and the last decision's update, as variables; call under the
        run's strategy scope (training/opening/build.py does)."""
        self.state = tf.Module(name="adaptive_batch")
        with self.state.name_scope:
            self.state.target = plan_variable(self.minimum, "target_tokens")
            self.state.decided_at = plan_variable(0, "decided_at")
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

    def smallest_tokens(self):
        return self.minimum

    def largest_micro_batch(self, replicas):
        """Half of MIN: a window must hold two micro-batches for the noise scale
        to be measured from the first update on. Unbounded when MIN is counted in
        micro-batches."""
        if self.relative:
            return sys.maxsize
        return min(self.minimum // replicas, self.minimum // 2)

    def adopt_state(self, other):
        """A re-planned run (batch_size=0 resolved) that has not decided yet
        starts from this plan's MIN, which may differ from the provisional one."""
        super().adopt_state(other)
        if self.state is not None and int(self.state.decided_at) == 0:
            self.state.target.assign(self.minimum)

    def check_batch_size(self, batch_size, replicas):
        if self.minimum < 2 * batch_size:
            raise BatchPlanError(
                f"batch_size_schedule '{self.text}': MIN {self.minimum} must hold two "
                f"micro-batches (2 × batch_size {batch_size}) for the noise scale it "
                "follows to be measured."
            )
        super().check_batch_size(batch_size, replicas)

    def check_hparams(self, hp):
        if not hp.log_noise_scale:
            raise HParamsError(
                f"batch_size_schedule '{self.text}' follows the noise scale: it "
                "needs log_noise_scale=true."
            )
        factors = [f.strip() for f in hp.learning_rate_schedule.split("*")]
        if "linear_decay" in factors and hp.learning_rate_schedule_unit != "tokens":
            raise HParamsError(
                f"batch_size_schedule '{self.text}' cannot know the run's number of "
                "updates in advance, which learning_rate_schedule's linear_decay "
                "needs; count the schedule in tokens "
                "(learning_rate_schedule_unit=tokens), use a fixed or scheduled "
                "batch, or another decay."
            )

    def train_updates(self, train_steps):
        """Unknown in advance: the count at MIN, an upper bound. linear_decay is
        refused with an adaptive batch unless the schedule counts tokens
        (check_hparams), so no built-in factor reads it."""
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
        wanted = self.wanted(noise_scale)
        if wanted is not None:
            new = int(min(self.maximum, max(old, min(2 * old, wanted))))
        self.state.target.assign(new)
        self.state.decided_at.assign(update)
        return old, new

    def wanted(self, noise_scale):
        """The tokens per update this plan aims at, before the limits (never
        shrink, at most double, MAX); None when it cannot tell yet."""
        if noise_scale is None or not math.isfinite(noise_scale):
            return None
        return self.fraction * noise_scale

    def decision_facts(self):
        """What the decision log line adds to the noise scale (subclasses)."""
        return ""

    def describe(self):
        toward = "the noise scale"
        if self.fraction != 1:
            toward = f"{self.fraction:g} × the noise scale"
        return (
            f"batch_size_schedule {self.text} (from {self.minimum} tokens per update, "
            f"toward {toward} every {self.every} updates, at most {self.maximum})"
        )


@register_batch_plan("adaptive")
def _adaptive(body, text, micro_batch_tokens):
    """`MIN,MAX[,EVERY[,FRACTION]]`, or nothing: from two micro-batches to 64. MIN
    must hold two micro-batches, for the noise scale it follows to be measured."""
    if not body:
        return AdaptiveWindows.in_micro_batches(text, micro_batch_tokens)
    usage = BatchPlanError(
        f"batch_size_schedule '{text}': adaptive takes MIN,MAX[,EVERY[,FRACTION]] "
        "(tokens, tokens, updates, a factor of the noise scale), e.g. "
        "adaptive:8192,262144,100 or adaptive:8192,262144,100,0.5."
    )
    minimum, maximum, every, fourth = parse_limits(body, text, usage)
    try:
        fraction = float(fourth) if fourth is not None else 1.0
    except ValueError:
        raise usage from None
    if not 0 < fraction < math.inf:
        raise BatchPlanError(
            f"batch_size_schedule '{text}': FRACTION must be a positive number, got "
            f"{fourth}."
        )
    return AdaptiveWindows(
        text, minimum, maximum, every, micro_batch_tokens, fraction=fraction
    )


def parse_limits(body, text, usage):
    """MIN,MAX[,EVERY[,FOURTH]] of an adaptive kind: (MIN, MAX, EVERY, the fourth
    value as text or None), checked; `usage` is raised for a malformed body."""
    values = body.split(",")
    if len(values) not in (2, 3, 4):
        raise usage
    try:
        minimum, maximum = int(values[0]), int(values[1])
        every = int(values[2]) if len(values) > 2 else DEFAULT_EVERY
    except ValueError:
        raise usage from None
    if minimum > maximum:
        raise BatchPlanError(
            f"batch_size_schedule '{text}': MIN {minimum} is larger than MAX {maximum}."
        )
    if every < 1:
        raise BatchPlanError(
            f"batch_size_schedule '{text}': EVERY must be >= 1 update, got {every}."
        )
    return minimum, maximum, every, values[3] if len(values) > 3 else None


def plan_variable(value, name, dtype=tf.int64):
    """A checkpointed variable of a plan's state: written by the host between
    steps, the same on every replica."""
    return first_replica_variable(value, dtype, name)
