"""Windows of varying size, by hand: the reference the batch-size schedule tests
compare TrainStep with (docs/design.md §2.7), and the driver that feeds a TrainStep
window by window as the trainer's loop does.

    g(u)      = Σ ∇(token loss sums of window u's micro-batches) / Σ their tokens
    sgd:      w ← w − lr(u) · g(u)
    momentum: v ← μ·v − lr(u) · g(u);  w ← w + v
    adam:     m ← β1(u)·m + (1 − β1(u))·g(u);  v ← β2(u)·v + (1 − β2(u))·g(u)²;
              w ← w − lr(u)·√(1 − P2(u)) / (1 − P1(u)) · m / (√v + ε),
              P(u) the product of β(0..u) (betas_of gives β1, β2, P1, P2)

with lr(u) = CONSTANT · linear_decay(u) = CONSTANT · (U − u) / DECAY: distinct at every
update. The reference's only shared parts are the model's forward pass and token_loss
(what "the loss" means); it never touches TrainStep, the accumulator or an optimizer
class.
"""

import numpy as np
import tensorflow as tf

from support.accumulation_helpers import (
    VOCAB,
    seeded_weights,
    tiny_hparams,
    uneven_micro_batches,
)
from t2t_lite.models.losses import token_loss
from t2t_lite.training.opening.build import build_training

CONSTANT, MOMENTUM, DECAY = 0.5, 0.9, 100
ADAM_EPSILON = 1e-3  # large enough that the update is not sign(m): ε matters
BETA_1, BETA_2 = 0.8, 0.95  # Adam's betas where they follow the tokens: far from 1
MICRO = 64  # batch_size: the tokens one micro-batch stands for in the schedules
RAMP = f"steps:0={MICRO},2={2 * MICRO},4={4 * MICRO}"  # windows of 1, 1, 2, 2, 4, 4…
WINDOWS = [1, 1, 2, 2, 4, 4]  # RAMP's first six windows: n changes twice


def hparams(optimizer, schedule=RAMP, replicas=1, **overrides):
    """tiny_hparams with the ramp, in tokens over all replicas."""
    if schedule == RAMP and replicas > 1:
        schedule = ",".join(
            f"{u}={t * replicas}"
            for u, t in ((0, MICRO), (2, 2 * MICRO), (4, 4 * MICRO))
        )
        schedule = "steps:" + schedule
    return tiny_hparams(
        optimizer=optimizer,
        batch_size=MICRO,
        batch_size_schedule=schedule,
        learning_rate_schedule="constant*linear_decay",
        learning_rate_constant=CONSTANT,
        learning_rate_decay_steps=DECAY,
        optimizer_momentum_momentum=MOMENTUM,
        optimizer_adam_epsilon=ADAM_EPSILON,
        **overrides,
    )


def ramp_micro_batches(seed):
    """uneven_micro_batches for WINDOWS, as tensors, ready for TrainStep.train_on."""
    return [
        {k: tf.constant(v) for k, v in b.items()}
        for b in uneven_micro_batches(sum(WINDOWS), seed=seed)
    ]


def start_weights():
    """The window tests' initial weights (seeded_weights: the same whatever ran
    before in the process)."""
    return seeded_weights(20261205)


def drive(step, batches, stop_after=None, on_decision=None):
    """Feeds `batches` to `step` window by window (TrainStep.windows, as the
    trainer's loop); returns the window sizes met. stop_after: micro-steps to run,
    possibly ending inside a window; on_decision: an adaptive plan's callback."""
    sizes, fed = [], 0
    limit = len(batches) if stop_after is None else stop_after
    for size, first in step.windows(on_decision):
        sizes.append(size)
        for position in range(first, size):
            step.train_on(batches[fed], position + 1 == size)
            fed += 1
            if fed == limit:
                return sizes


class Reference:
    """The update rules above in numpy, on gradients of a plain copy of the model."""

    def __init__(self, hp):
        self.model = build_training(hp, vocab_size=VOCAB, train_steps=1).model
        signature = {
            key: tf.TensorSpec([None, None], tf.int32) for key in ("inputs", "targets")
        }
        self.gradients = tf.function(self._gradients, input_signature=[signature])
        self.label_smoothing = hp.label_smoothing

    def _gradients(self, batch):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss_sum, count = token_loss(
                self.model(batch, training=True), batch["targets"], self.label_smoothing
            )
        grads = tape.gradient(loss_sum, variables)
        return [tf.convert_to_tensor(g) for g in grads], count

    def __call__(
        self, start, windows, optimizer, total_updates, rate_of=None, betas_of=None
    ):
        """(weights, momentum) after one update per window (a list of lists of
        numpy batches); linear_decay counts down from total_updates, unless
        `rate_of(u)` gives update u's rate. adam: (weights, (m, v)), with
        betas_of(u) = (β1, β2, P1, P2) and ε = ADAM_EPSILON."""
        self.model.set_weights(start)
        variables = self.model.trainable_variables
        weights = [v.numpy().astype(np.float64) for v in variables]
        velocity = [np.zeros_like(w) for w in weights]
        second = [np.zeros_like(w) for w in weights]
        for u, window in enumerate(windows):
            for v, w in zip(variables, weights):
                v.assign(w.astype(np.float32))
            total, tokens = [np.zeros_like(w) for w in weights], 0.0
            for batch in window:
                grads, count = self.gradients(
                    {k: tf.constant(b) for k, b in batch.items()}
                )
                total = [t + g.numpy() for t, g in zip(total, grads)]
                tokens += float(count)
            gradient = [t / tokens for t in total]
            if rate_of is None:
                rate = CONSTANT * min(max((total_updates - u) / DECAY, 0.0), 1.0)
            else:
                rate = rate_of(u)
            if optimizer == "sgd":
                weights = [w - rate * g for w, g in zip(weights, gradient)]
            elif optimizer == "adam":
                beta_1, beta_2, power_1, power_2 = betas_of(u)
                velocity = [
                    beta_1 * m + (1 - beta_1) * g for m, g in zip(velocity, gradient)
                ]
                second = [
                    beta_2 * v + (1 - beta_2) * g**2 for v, g in zip(second, gradient)
                ]
                alpha = rate * np.sqrt(1 - power_2) / (1 - power_1)
                weights = [
                    w - alpha * m / (np.sqrt(v) + ADAM_EPSILON)
                    for w, m, v in zip(weights, velocity, second)
                ]
            else:
                velocity = [MOMENTUM * v - rate * g for v, g in zip(velocity, gradient)]
                weights = [w + v for w, v in zip(weights, velocity)]
        if optimizer == "adam":
            return weights, (velocity, second)
        return weights, velocity


def hand_betas(reference, beta_1_follows, micro_tokens=MICRO):
    """Update u's (β1, β2, Π β1, Π β2) over WINDOWS under the half-life rule
    (optim/token_adam.py), by hand: β ** (tokens(u) / reference), with tokens(u) =
    n(u) · micro_tokens, the planned tokens of a micro-step over all replicas."""
    out, trained = [], 0
    for u, size in enumerate(WINDOWS):
        tokens = size * micro_tokens
        now, total = tokens / reference, (trained + tokens) / reference
        beta_1, power_1 = BETA_1, BETA_1 ** (u + 1)
        if beta_1_follows:
            beta_1, power_1 = BETA_1**now, BETA_1**total
        out.append((beta_1, BETA_2**now, power_1, BETA_2**total))
        trained += tokens
    return out


def split_into_windows(items, sizes):
    """items cut into consecutive groups of the given sizes."""
    out, start = [], 0
    for size in sizes:
        out.append(items[start : start + size])
        start += size
    return out


def ratio(actual, expected, rtol=1e-5, atol=1e-7):
    """max |a − e| / (rtol·|e| + atol) over all arrays; < 1 means equal."""
    return max(
        float(np.max(np.abs(np.asarray(a) - e) / (rtol * np.abs(e) + atol)))
        for a, e in zip(actual, expected)
    )
