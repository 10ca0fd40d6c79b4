"""The gradient noise scale B_simple = tr(Σ) / |G|², measured from accumulation
(docs/design.md §2.8; McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", appendix A).

Accumulation sees two batch sizes on every update for free: each micro-batch's
token-normalized gradient g_i (B_i tokens) and the window's g (B tokens, all
micro-batches of all replicas). If every token's gradient is an independent draw with
mean G and covariance Σ, then E|g_i|² = |G|² + tr(Σ)/B_i and E|g|² = |G|² + tr(Σ)/B.
With S = mean |g_i|² and m = mean 1/B_i over the window's micro-batches, the unbiased
estimates are

    tr(Σ) ≈ (S − |g|²) / (m − 1/B),        |G|² ≈ |g|² − tr(Σ) / B.

Each is noisy on one update (either can be negative), so both are averaged by an
exponential moving average (bias-corrected as Adam's moments are) before their ratio
is taken. B_simple is in tokens: the batch beyond which more tokens per update stop
paying off in fewer updates.

Cost: one squared norm of each micro-batch's gradient (an embedding's IndexedSlices
summed per row first, as the dense gradient would be), kept in replica-local sums;
the sums ride the update's one all-reduce. The update itself is unchanged.
"""

import tensorflow as tf

from t2t_lite.state_variables import (
    first_replica_variable,
    replica_sum_variable,
    sums_over_replicas,
)


def squared_norm(gradients):
    """|g|² over all gradients, float32; IndexedSlices count as their dense sum
    (duplicate rows added before squaring) without building the dense tensor."""
    halves = []
    for gradient in gradients:
        if gradient is None:
            continue
        if isinstance(gradient, tf.IndexedSlices):
            rows, position = tf.unique(gradient.indices)
            values = tf.math.unsorted_segment_sum(
                tf.cast(gradient.values, tf.float32), position, tf.shape(rows)[0]
            )
        else:
            values = tf.cast(gradient, tf.float32)
        # L2Loss (sum of squares / 2) is one kernel reading the gradient once;
        # Square + Sum would first write a gradient-sized temporary.
        halves.append(tf.nn.l2_loss(values))
    if not halves:
        return tf.constant(0.0, tf.float32)
    # One AddN and one doubling, not an add and a multiply per variable: both
    # step functions compute this, and every graph op costs tracing and Grappler
    # time at each run's start (for transformer_test, a multiply and an add per
    # variable were a third of the accumulating function's own ops).
    return 2.0 * tf.add_n(halves)


class NoiseScale(tf.Module):
    """Per-window sums of micro-batch statistics (replica-local) and the moving
    averages of the two estimates (the same on every replica), all checkpointed."""

    def __init__(self, decay, name="noise_scale"):
        super().__init__(name=name)
        self.decay = decay
        with self.name_scope:
            # Over this window's micro-batches so far, on this replica:
            # Σ |grad_i|² / B_i², Σ 1 / B_i and the number of micro-batches.
            self.square_sum = replica_sum_variable(0.0, "micro_square_sum")
            self.inverse_tokens = replica_sum_variable(0.0, "micro_inverse_tokens")
            self.count = replica_sum_variable(0.0, "micro_count")
            self.trace_average = first_replica_variable(
                0.0, tf.float32, "trace_average"
            )
            self.gradient_average = first_replica_variable(
                0.0, tf.float32, "gradient_square_average"
            )
            self.weight = first_replica_variable(
                0.0, tf.float32, "average_weight"
            )  # 1 - decay^k, k estimates

    @staticmethod
    def micro_batch(gradients, tokens):
        """(|g_i|², 1/B_i, 1) of one micro-batch from its summed-loss gradients."""
        # An empty micro-batch (a replica's share of a split one can be) is no
        # sample of the gradient: it adds nothing.
        present = tf.cast(tokens > 0, tf.float32)
        tokens = tf.maximum(tokens, 1.0)
        return (
            present * squared_norm(gradients) / tf.square(tokens),
            present / tokens,
            present,
        )

    def add(self, stats):
        for variable, value in zip(self._sums(), stats):
            variable.assign_add(value)

    def window(self, stats):
        """This replica's window sums including the last micro-batch's `stats`
        (reset_window() starts the next window's)."""
        return [v.read_value() + s for v, s in zip(self._sums(), stats)]

    def reset_window(self):
        for variable in self._sums():
            variable.assign(0.0)

    def _sums(self):
        return (self.square_sum, self.inverse_tokens, self.count)

    def summed(self, strategy):
        """What a checkpoint writes in place of this module on several replicas:
        the same attributes (so the same keys), the window sums over all replicas
        gathered at once (state_variables.sums_over_replicas), the averages as
        they are."""
        stand_in = tf.Module(name=self.name)
        stand_in.square_sum, stand_in.inverse_tokens, stand_in.count = (
            sums_over_replicas(self._sums(), strategy)
        )
        stand_in.trace_average = self.trace_average
        stand_in.gradient_average = self.gradient_average
        stand_in.weight = self.weight
        return stand_in

    def update(self, square_sum, inverse_tokens, count, big_square, tokens, valid):
        """Folds one update's estimates into the averages (only where `valid` and
        the window had two different batch sizes) and returns B_simple in tokens
        (0 before the first estimate). All arguments are all-reduced sums."""
        count = tf.maximum(count, 1.0)
        mean_square, mean_inverse = square_sum / count, inverse_tokens / count
        inverse_big = 1.0 / tf.maximum(tokens, 1.0)
        spread = mean_inverse - inverse_big  # > 0 iff more than one micro-batch
        trace = (mean_square - big_square) / tf.maximum(spread, 1e-30)
        gradient = big_square - trace * inverse_big
        usable = (
            valid
            & (spread > 1e-6 * mean_inverse)
            & tf.math.is_finite(trace)
            & tf.math.is_finite(gradient)
        )
        d = self.decay

        def fold(average, value):
            return tf.where(usable, d * average + (1.0 - d) * value, average)

        self.trace_average.assign(fold(self.trace_average, trace))
        self.gradient_average.assign(fold(self.gradient_average, gradient))
        self.weight.assign(fold(self.weight, 1.0))
        return self.value()

    def value(self):
        """B_simple from the averages (their bias corrections cancel in the ratio);
        0 before any estimate, inf if the gradient estimate is not positive."""
        gradient = self.gradient_average
        scale = self.trace_average / tf.where(gradient > 0, gradient, 1.0)
        scale = tf.where(gradient > 0, scale, float("inf"))
        return tf.where(self.weight > 0, scale, 0.0)
