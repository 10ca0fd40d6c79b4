"""Learning-rate schedules written as T2T's "factor*factor*..." strings.

Each factor is a small named function of the update step (a float32 tensor) and a
`ScheduleConfig`; the string only selects and multiplies them. The step is the number
of optimizer *updates* so far (0-based), never the micro-step: with gradient
accumulation over n micro-batches, update u gets exactly the rate a big-batch run uses at
its step u, and `train_steps` is converted to updates (train_steps / n, or the number of
updates train_steps micro-batches give under a batch plan) before it reaches any
factor — the two places where T2T and Keras 3 go wrong.

Two hparams make the rate follow the batch (`BatchFollowingSchedule`, docs/batch.md):
learning_rate_batch_scaling multiplies it by (tokens(u) / reference)^p, p = 1/2
(sqrt) or 1 (linear), and learning_rate_schedule_unit=tokens makes the step count
tokens trained on, in update-equivalents at the reference batch.
"""

import dataclasses
import math

import keras
import tensorflow as tf

from t2t_lite.errors import UserError
from t2t_lite.state_variables import first_replica_variable


class ScheduleError(UserError):
    """A user-facing schedule error with a one-line message."""


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Everything the factors read, in update units."""

    constant: float
    warmup_steps: float
    hidden_size: int
    # The schedule's step at train_steps micro-steps: updates under the batch plan
    # (optim/batch_plan.py), or update-equivalents of tokens (schedule unit tokens)
    train_updates: float
    decay_steps: float
    decay_rate: float
    decay_staircase: bool


def constant(step, c):
    del step
    return tf.constant(c.constant, tf.float32)


def linear_warmup(step, c):
    return tf.minimum(1.0, step / max(c.warmup_steps, 1.0))


def rsqrt_decay(step, c):
    # max(..., 1): with warmup 0, T2T's rsqrt(0) is inf (and inf * 0 = NaN at step 0).
    return tf.math.rsqrt(tf.maximum(step, max(float(c.warmup_steps), 1.0)))


def rsqrt_normalized_decay(step, c):
    return math.sqrt(c.warmup_steps) * rsqrt_decay(step, c)


def rsqrt_hidden_size(step, c):
    del step
    return tf.constant(c.hidden_size**-0.5, tf.float32)


def linear_decay(step, c):
    """Linear ramp to 0 over the last decay_steps updates before train_updates."""
    remaining = (c.train_updates - step) / max(c.decay_steps, 1.0)
    return tf.clip_by_value(remaining, 0.0, 1.0)


def cosdecay(step, c):
    """1 during warmup, then half a cosine period over decay_steps (as T2T)."""
    in_warmup = tf.cast(step <= c.warmup_steps, tf.float32)
    decayed = 0.5 * (1.0 + tf.cos(math.pi * step / max(c.decay_steps, 1.0)))
    return in_warmup + (1.0 - in_warmup) * decayed


def exp_decay(step, c):
    """decay_rate ** ((step - warmup) / decay_steps), after warmup."""
    p = tf.maximum((step - c.warmup_steps) / max(c.decay_steps, 1.0), 0.0)
    if c.decay_staircase:
        p = tf.floor(p)
    return tf.pow(tf.constant(c.decay_rate, tf.float32), p)


FACTORS = {
    f.__name__: f
    for f in (
        constant,
        linear_warmup,
        rsqrt_decay,
        rsqrt_normalized_decay,
        rsqrt_hidden_size,
        linear_decay,
        cosdecay,
        exp_decay,
    )
}


def register_factor(factor):
    """Decorator adding a user's factor `f(step, config) -> float32 tensor` under its
    function name (step: the 0-based update, a float32 tensor; config: a
    ScheduleConfig), for learning_rate_schedule strings (see docs/extending.md)."""
    name = factor.__name__
    if name in FACTORS:
        raise ScheduleError(f"learning-rate factor '{name}' is registered twice.")
    FACTORS[name] = factor
    return factor


def parse_schedule(text):
    """ "a*b*c" → [factor functions]; unknown names are a one-line error."""
    names = [name.strip() for name in text.split("*")]
    unknown = [name for name in names if name not in FACTORS]
    if not text.strip() or unknown:
        raise ScheduleError(
            f"learning_rate_schedule '{text}': unknown factor "
            f"'{unknown[0] if unknown else ''}'. Known factors: "
            f"{', '.join(sorted(FACTORS))}."
        )
    return [FACTORS[name] for name in names]


@keras.saving.register_keras_serializable("t2t_lite")
class LearningRateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The parsed product of factors, called by the optimizer with its update count.

    Keras optimizers call the schedule with `optimizer.iterations`, which t2t_lite only
    increments on real updates, so `step` is the 0-based update index.
    """

    def __init__(self, text, config):
        self.text = text
        self.config = config
        self.factors = parse_schedule(text)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        rate = tf.constant(1.0, tf.float32)
        for factor in self.factors:
            rate = rate * factor(step, self.config)
        return rate

    def get_config(self):
        return {"text": self.text, "config": dataclasses.asdict(self.config)}

    @classmethod
    def from_config(cls, config):
        return cls(config["text"], ScheduleConfig(**config["config"]))


# learning_rate_batch_scaling → the exponent p of (tokens(u) / reference)^p
RATE_RULES = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}
# learning_rate_schedule_unit: what the schedule's step counts
SCHEDULE_UNITS = ("updates", "tokens")


class BatchClock(tf.Module):
    """What a learning rate that follows the batch reads, kept by the train step
    (training/step/train_step.py) and checkpointed with it.

    window_tokens: the planned tokens of the window being trained (its size × the
    micro-batch's tokens), set when the window starts. tokens_trained: the planned
    tokens of the updates applied so far. applied_rate: the rate of the last
    applied update, for the logs.
    """

    def __init__(self):
        super().__init__(name="batch_clock")
        with self.name_scope:
            self.window_tokens = first_replica_variable(0, tf.int64, "window_tokens")
            self.tokens_trained = first_replica_variable(0, tf.int64, "tokens_trained")
            self.applied_rate = first_replica_variable(0.0, tf.float32, "applied_rate")


class BatchFollowingSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr(u) = schedule(s(u)) × (window_tokens(u) / reference)^p (docs/batch.md).

    s(u) is the update step u (unit "updates") or tokens_trained / reference (unit
    "tokens": update-equivalents at the reference batch, so that warmup and decay
    cover the same data whatever the batch plan). Both read the run's BatchClock,
    whose tokens are planned (whole micro-batches of batch_size × replicas tokens,
    padding included), not counted: the rate of an update is then a function of the
    plan alone, the same on every replica and in a resumed run, and unchanged when a
    micro-batch is split because it ran out of memory. The non-pad tokens of a
    window vary with padding from batch to batch, which would add noise to the rate
    that says nothing about the batch's size.
    """

    def __init__(self, schedule, clock, exponent, reference_tokens, unit):
        self.schedule, self.clock = schedule, clock
        self.exponent, self.unit = exponent, unit
        self.reference_tokens = float(reference_tokens)

    def __call__(self, step):
        if self.unit == "tokens":
            trained = tf.cast(self.clock.tokens_trained, tf.float64)
            step = tf.cast(trained / self.reference_tokens, tf.float32)
        rate = self.schedule(step)
        if self.exponent:
            ratio = (
                tf.cast(self.clock.window_tokens, tf.float32) / self.reference_tokens
            )
            rate = rate * tf.pow(ratio, self.exponent)
        return rate

    def get_config(self):  # lives only inside a run: never serialized
        raise NotImplementedError("a BatchFollowingSchedule is not serializable")


def reference_tokens(hp, plan):
    """learning_rate_reference_tokens, or (0) the first update's planned tokens."""
    return hp.learning_rate_reference_tokens or plan.tokens(0)


def schedule_from_hparams(hp, train_steps, plan, clock=None):
    """The learning rate of a run with the batch plan `plan` (optim/batch_plan.py).

    train_steps counts micro-steps: factors that use it see the updates they give
    under the plan, or, with learning_rate_schedule_unit=tokens, their planned
    tokens / the reference (every micro-step is one micro-batch of the plan's
    micro_batch_tokens). With learning_rate_batch_scaling or the token unit the rate
    reads `clock` (a BatchClock the train step keeps); otherwise it is the plain
    schedule of the update step, and `clock` is not needed.
    """
    exponent = RATE_RULES[hp.learning_rate_batch_scaling]
    unit = hp.learning_rate_schedule_unit
    reference = reference_tokens(hp, plan)
    if unit == "tokens":
        horizon = train_steps * plan.micro_batch_tokens / reference
    else:
        horizon = plan.train_updates(train_steps)
    config = ScheduleConfig(
        constant=hp.learning_rate_constant,
        warmup_steps=float(hp.learning_rate_warmup_steps),
        hidden_size=hp.hidden_size,
        train_updates=horizon,
        decay_steps=float(hp.learning_rate_decay_steps),
        decay_rate=hp.learning_rate_decay_rate,
        decay_staircase=hp.learning_rate_decay_staircase,
    )
    schedule = LearningRateSchedule(hp.learning_rate_schedule, config)
    if not exponent and unit == "updates":
        return schedule
    if clock is None:
        raise ValueError("a rate that follows the batch needs the run's BatchClock")
    return BatchFollowingSchedule(schedule, clock, exponent, reference, unit)
