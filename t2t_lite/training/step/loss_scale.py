"""Dynamic loss scaling for float16, owned by the train step (docs/design.md §2.3).

Why not Keras's LossScaleOptimizer: the train step skips a non-finite update before
the optimizer sees it, so the wrapper's scale would never drop; and the wrapper would
sit between the train step and the single all-reduce per update.

How the scale is applied, and why it cannot overflow from the token sum:
the train step differentiates the SUMMED token loss (normalized once per update), so
a micro-batch's gradients are ~tokens× larger than those of the mean loss other
frameworks scale. Each micro-batch's loss is therefore multiplied by
`scale / micro_batch_tokens`, where `micro_batch_tokens` is the most tokens a
micro-batch can hold (batch_size, or max_length when longer). The factor is the same
for every micro-batch, so the accumulated sums stay exact sums; and since a
micro-batch has at most `micro_batch_tokens` tokens, the scaled loss is at most
`scale` × its mean token loss: the float16 backward pass sees what a mean loss
scaled by `scale` would give, whatever the batch size, never tokens × scale. The
summed gradient is unscaled once per update (× micro_batch_tokens / scale), before
the token normalization, weight decay, clipping and the finite check.

Dynamics (Keras's defaults): start at 2**15; an update whose loss is finite but whose
gradient is not is an overflow: the whole update is skipped, the scale halves, and it
is counted apart from divergence. After `growth_interval` applied updates in a row the
scale doubles. Scales are powers of two, so scaling is exact in float arithmetic.
At scale 1 an overflow is no longer a scaling problem: it counts as a bad update (the
divergence guard). Scale, growth counter and overflow count are checkpointed; the
scale only changes at updates, so mid-window accumulators (scaled sums) stay valid.
"""

import tensorflow as tf

from t2t_lite.state_variables import first_replica_variable

INITIAL_SCALE = 2.0**15
GROWTH_INTERVAL = 2000


class DynamicLossScale(tf.Module):
    """The loss scale and its counters; create under the strategy's scope."""

    def __init__(
        self,
        micro_batch_tokens,
        initial_scale=INITIAL_SCALE,
        growth_interval=GROWTH_INTERVAL,
        name="loss_scale",
    ):
        super().__init__(name=name)
        if micro_batch_tokens < 1:
            raise ValueError(
                f"micro_batch_tokens must be >= 1, got {micro_batch_tokens}"
            )
        self.micro_batch_tokens = float(micro_batch_tokens)
        self.growth_interval = growth_interval
        self.scale = first_replica_variable(initial_scale, tf.float32, "scale")
        self.good_updates = first_replica_variable(
            0, tf.int64, "good_updates"
        )  # since last change
        self.overflows = first_replica_variable(
            0, tf.int64, "overflows"
        )  # skipped for overflow

    def scale_loss(self, loss_sum):
        """A micro-batch's summed loss × scale / micro_batch_tokens."""
        return loss_sum * (tf.convert_to_tensor(self.scale) / self.micro_batch_tokens)

    def unscale_factor(self):
        """What turns summed scaled gradients into summed gradients of the loss."""
        return self.micro_batch_tokens / tf.convert_to_tensor(self.scale)

    def can_lower(self):
        """Whether an overflow can still be answered by a smaller scale."""
        return tf.convert_to_tensor(self.scale) > 1.0

    def on_applied(self):
        """An applied update: count it; double the scale after growth_interval."""
        grown = self.good_updates + 1 >= self.growth_interval
        self.scale.assign(tf.where(grown, self.scale * 2.0, self.scale))
        self.good_updates.assign(
            tf.where(grown, tf.constant(0, tf.int64), self.good_updates + 1)
        )

    def on_overflow(self):
        """A skipped update: halve the scale (not below 1), count the overflow."""
        self.scale.assign(tf.maximum(self.scale * 0.5, 1.0))
        self.good_updates.assign(0)
        self.overflows.assign_add(1)
