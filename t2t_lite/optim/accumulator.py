"""Replica-local float32 gradient accumulators for exact multi-step updates.

For every trainable variable the accumulator keeps the running SUM of gradients of the
summed (not averaged) token loss, and next to it the running sums of token losses and
non-pad target tokens. At the update, gradient / tokens is exactly the big-batch
gradient (docs/design.md §2): a mean of micro-batch means would weight a short micro-batch's
tokens more than a long one's.

The variables are ON_READ (replica-local under tf.distribute, plain variables
otherwise), so replicas never talk between updates. They are float32 whatever the
model's compute dtype, and they are checkpointed: with the global step (whose value mod
n is the position inside the window) they let a run resume mid-window exactly. On
several replicas a checkpoint holds their sums over all replicas (`summed`).
"""

import tensorflow as tf

from t2t_lite.state_variables import replica_sum_variable, sums_over_replicas


def _replica_copy(variable):
    """This replica's own component of an ON_READ variable (the variable itself when
    not distributed). tf.distribute refuses `scatter_add` on the distributed wrapper,
    but the component is a plain variable that supports it; there is no public
    accessor, hence the private one, guarded."""
    component = getattr(variable, "_get_on_device_or_primary", None)
    return component() if component is not None else variable


class GradientAccumulator(tf.Module):
    """Sums of gradients, token losses and token counts over one accumulation window."""

    def __init__(self, variables, name="accumulator"):
        super().__init__(name=name)
        self.gradients = [
            replica_sum_variable(tf.zeros(v.shape, tf.float32), f"grad_{i}")
            for i, v in enumerate(variables)
        ]
        self.loss_sum = replica_sum_variable(0.0, "loss_sum")
        self.tokens = replica_sum_variable(0.0, "tokens")

    def add(self, gradients, loss_sum, tokens):
        """Adds one micro-batch; embedding IndexedSlices are scattered, never densified."""
        for accumulator, gradient in zip(self.gradients, gradients):
            if gradient is None:
                continue
            if isinstance(gradient, tf.IndexedSlices):
                _replica_copy(accumulator).scatter_add(
                    tf.IndexedSlices(
                        tf.cast(gradient.values, tf.float32),
                        gradient.indices,
                        gradient.dense_shape,
                    )
                )
            else:
                accumulator.assign_add(tf.cast(gradient, tf.float32))
        self.loss_sum.assign_add(loss_sum)
        self.tokens.assign_add(tokens)

    def plus(self, gradients, loss_sum, tokens):
        """(window gradients, loss sum, tokens): the accumulated sums plus this last
        micro-batch, without writing it into the accumulators first (they are reset
        right after). IndexedSlices become dense here, once per update."""
        return (
            [
                accumulator + tf.cast(tf.convert_to_tensor(g), tf.float32)
                if g is not None
                else tf.identity(accumulator)
                for accumulator, g in zip(self.gradients, gradients)
            ],
            self.loss_sum + loss_sum,
            self.tokens + tokens,
        )

    def reset(self):
        """Zeroes the sums in place. Not `assign(zeros_like(...))`: the compiled
        update folds that into constant zero tensors (one per shape) which the
        accumulators then alias, so the next window's first add copies them and the
        constants stay live (~ one more model copy, tests/test_memory.py). 0 * sum
        via multiply_no_nan computes zeros from the sum's own buffer, and is 0 even
        where an overflowed window left Inf or NaN (0 * Inf would be NaN)."""
        # One constant for all, and value() (read_value() adds an Identity): the
        # graph's every op costs time at each run's start, in tracing and Grappler.
        zero = tf.constant(0.0)
        for accumulator in self.gradients:
            accumulator.assign(tf.math.multiply_no_nan(accumulator.value(), zero))
        self.loss_sum.assign(0.0)
        self.tokens.assign(0.0)

    def summed(self, strategy):
        """What a checkpoint writes in place of this module on several replicas: a
        module of the same shape (so the same keys) holding the sums over all
        replicas, gathered at once (state_variables.sums_over_replicas)."""
        *gradients, loss_sum, tokens = sums_over_replicas(
            [*self.gradients, self.loss_sum, self.tokens], strategy
        )
        stand_in = tf.Module(name=self.name)
        stand_in.gradients = gradients
        stand_in.loss_sum, stand_in.tokens = loss_sum, tokens
        return stand_in
