"""Learning-rate schedules written as T2T's "factor*factor*..." strings.

Each factor is a small named function of the update step (a float32 tensor) and a
`ScheduleConfig`; the string only selects and multiplies them. The step is always the
number of optimizer *updates* so far (0-based), never the micro-step: with gradient
accumulation over n micro-batches, update u gets exactly the rate a big-batch run uses at
its step u, and `train_steps` is converted to updates (train_steps / n, or the number of
updates train_steps micro-batches give under a batch-size schedule) before it reaches
any factor — the two places where T2T and Keras 3 go wrong.
"""

import dataclasses
import math

import keras
import tensorflow as tf

from t2t_lite.errors import UserError


class ScheduleError(UserError):
    """A user-facing schedule error with a one-line message."""


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Everything the factors read, in update units."""

    constant: float
    warmup_steps: float
    hidden_size: int
    train_updates: float  # updates in train_steps micro-steps (optim/batch_schedule.py)
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


def schedule_from_hparams(hp, train_steps, replicas=1, plan=None):
    """Builds the schedule; `train_steps` counts micro-steps and is turned into
    updates by the run's window plan (`plan`, or the one hp gives on `replicas`)."""
    from t2t_lite.optim.batch_schedule import window_plan  # here: import cycle

    plan = plan or window_plan(hp, replicas)
    config = ScheduleConfig(
        constant=hp.learning_rate_constant,
        warmup_steps=float(hp.learning_rate_warmup_steps),
        hidden_size=hp.hidden_size,
        train_updates=plan.train_updates(train_steps),
        decay_steps=float(hp.learning_rate_decay_steps),
        decay_rate=hp.learning_rate_decay_rate,
        decay_staircase=hp.learning_rate_decay_staircase,
    )
    return LearningRateSchedule(hp.learning_rate_schedule, config)


def accumulate_steps(hp, replicas=1):
    """The accumulation steps n ≥ 1 of a run on `replicas` replicas.

    optimizer_multistep_accumulate_steps, validated (0 and 1: no accumulation); or,
    when effective_batch_size (tokens per update) is set, the fewest micro-batches of
    batch_size tokens on every replica that reach it: ceil(effective_batch_size /
    (batch_size × replicas)). Then n depends on the replica count; the trainer
    records it and refuses a resume that would change it.
    """
    n = hp.optimizer_multistep_accumulate_steps
    if type(n) is not int:  # bool is an int subclass; refuse it too
        raise ScheduleError(
            f"optimizer_multistep_accumulate_steps must be an integer, got {n!r}."
        )
    if n < 0:
        raise ScheduleError(
            f"optimizer_multistep_accumulate_steps must be >= 0, got {n}."
        )
    target = getattr(hp, "effective_batch_size", 0)  # absent in older hparams.json
    if target > 0:
        return -(-target // (hp.batch_size * replicas))
    return max(n, 1)
