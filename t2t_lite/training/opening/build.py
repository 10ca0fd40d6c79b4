"""The one place that assembles what a run computes with, its TrainingParts:
model → schedule → optimizer → TrainStep.

The trainer, the tests and the benchmarks all call `build_training`, so an equivalence
test exercises exactly what `t2t-trainer` trains with, not a copy of its assembly.
Every variable (weights, optimizer slots, accumulators, counters) is created under
`strategy.scope()`, so the same code builds the parts of a single-device run or of a
MirroredStrategy / MultiWorkerMirroredStrategy one.
"""

import dataclasses

import tensorflow as tf

from t2t_lite.models.factory import build_model
from t2t_lite.optim.batch_plan import plan_from_hparams
from t2t_lite.optim.optimizers import optimizer_from_hparams
from t2t_lite.optim.schedule import BatchClock, schedule_from_hparams
from t2t_lite.optim.token_adam import TokenHalfLifeAdam
from t2t_lite.registry import MODELS
from t2t_lite.training.step.loss_scale import DynamicLossScale
from t2t_lite.training.step.train_step import TrainStep


@dataclasses.dataclass
class TrainingParts:
    """What a training run computes with (data and files are the trainer's)."""

    hp: object
    model: object
    schedule: object  # update step -> learning rate
    optimizer: object
    step: TrainStep
    strategy: tf.distribute.Strategy
    # The replica count, checkpointed: a resume on another count is noticed.
    replicas_variable: tf.Variable

    def checkpoint(self, **extra):
        """A tf.train.Checkpoint of everything needed to resume exactly (plus
        `extra`, e.g. the input iterators)."""
        return tf.train.Checkpoint(
            **self.step.checkpoint_items(),
            train_replicas=self.replicas_variable,
            **extra,
        )


def build_training(
    hp,
    *,
    vocab_size,
    train_steps,
    model="transformer",
    strategy=None,
    initial_weights=None,
    jit_compile=False,
    plan=None,
):
    """Builds the model, schedule, optimizer and TrainStep of `hp` under `strategy`.

    model: a registered model name (or a model class). train_steps: micro-steps, as
    in T2T; the schedule sees the updates they give (docs/design.md §2). plan: the
    run's batch plan (optim/batch_plan.py), hp's on the strategy's replicas unless
    given; the train step, the schedule and the loop share it. initial_weights: a
    `model.get_weights()` list to start from (equivalence tests start two runs from
    the same weights). jit_compile: XLA-compile each replica's forward and backward
    (TrainStep; feed it bucket-padded batches, see data.pipeline's pad_to_bucket).
    """
    strategy = strategy or tf.distribute.get_strategy()
    model_class = MODELS.get(model) if isinstance(model, str) else model
    with strategy.scope():
        the_model = build_model(model_class, hp, vocab_size)
        if initial_weights is not None:
            the_model.set_weights(initial_weights)
        plan = plan or plan_from_hparams(hp, strategy.num_replicas_in_sync)
        clock = BatchClock()  # what a rate that follows the batch reads
        schedule = schedule_from_hparams(hp, train_steps, plan, clock)
        optimizer = _optimizer(hp, schedule, clock)
        loss_scale = None
        if hp.activation_dtype == "float16":
            # The most tokens one micro-batch can hold (training/step/loss_scale.py).
            loss_scale = DynamicLossScale(max(hp.batch_size, hp.max_length))
    step = TrainStep(
        the_model,
        optimizer,
        windows=plan,
        noise_scale_decay=_noise_scale_decay(hp),
        label_smoothing=hp.label_smoothing,
        clip_grad_norm=hp.clip_grad_norm,
        weight_decay=hp.weight_decay,
        strategy=strategy,
        loss_scale=loss_scale,
        jit_compile=jit_compile,
        clock=clock,
    )
    replicas = tf.Variable(
        strategy.num_replicas_in_sync, dtype=tf.int64, trainable=False, name="replicas"
    )
    return TrainingParts(hp, the_model, schedule, optimizer, step, strategy, replicas)


def replan(parts, hp, train_steps):
    """Gives built TrainingParts the micro-batch of `hp` (batch_size=0 resolved,
    training/opening/auto_batch.py): its window plan, the schedule that counts the updates
    of that plan, the loss scale's micro-batch bound, and a fresh trace of the
    step. The variables stay: `parts` were built with a smaller micro-batch, so with at
    least the accumulators and noise-scale state this plan needs."""
    plan = plan_from_hparams(hp, parts.strategy.num_replicas_in_sync)
    parts.schedule = schedule_from_hparams(hp, train_steps, plan, parts.step.clock)
    parts.optimizer.learning_rate = parts.schedule
    parts.hp = hp
    # Keeps the old plan's state, traces anew:
    parts.step.set_plan(plan, micro_batch_tokens=max(hp.batch_size, hp.max_length))
    return parts


def _optimizer(hp, schedule, clock):
    """hp's registered optimizer; Adam with betas of a fixed half-life in tokens
    when adam_beta_tokens_reference is set (hparams_checks: only for Adam)."""
    if not hp.adam_beta_tokens_reference:
        return optimizer_from_hparams(hp, schedule)
    return TokenHalfLifeAdam(
        clock,
        hp.adam_beta_tokens_reference,
        beta_1_follows=hp.adam_beta1_follows_tokens,
        learning_rate=schedule,
        beta_1=hp.optimizer_adam_beta1,
        beta_2=hp.optimizer_adam_beta2,
        epsilon=hp.optimizer_adam_epsilon,
    )


def _noise_scale_decay(hp):
    """The noise scale's moving-average decay, or None when log_noise_scale is off
    (an hparams.json older than these keys has them at their defaults once
    loaded: hparams_sets.with_new_keys_at_defaults)."""
    return hp.noise_scale_decay if hp.log_noise_scale else None
