"""Kernels written for speed on CPUs, apart from the architecture they serve.

models/transformer.py describes the Transformer; the two functions here compute the
same mathematics as their Keras/TF counterparts with fewer element-wise passes,
because on a 2-core CPU the float32 translation step (scripts/bench_step.py) spends
a large share of its op time outside the matmuls. Each is tested against the
reference it replaces (tests/test_transformer.py), and each was kept because it paid
in the whole step, measured side by side (docs/benchmarks.md, "Step profile"):

- `dropout`: masks from 16 random bits per element (one Philox draw serves two
  elements) and a gradient that selects against a scalar zero. The random-number
  kernel was the largest non-matmul cost of the step; dropout plus the fused loss
  (models/losses.py) gave 1.056× the step's tokens/s.
- `LayerNormalization`: Keras's layer (same weights, names, checkpoint keys) with a
  closed-form gradient: Keras builds ~20 element-wise ops per norm and leaves the
  backward pass to autodiff (8% of the step's op time on a CPU without oneDNN);
  1.06× the whole step's tokens/s, fwd+bwd 1.4× faster at [2048, 256].
"""

import keras
import tensorflow as tf


def dropout(x, rate, training, seed_generator):
    """Dropout, an exact no-op unless training with rate > 0.

    Masks come from the layer's keras.random.SeedGenerator: seeded by
    keras.utils.set_random_seed, and its state is checkpointed (one of the model's
    non_trainable_variables), so a resumed run draws the masks an uninterrupted run
    would have drawn. Under tf.distribute every replica advances the same generator
    state, so the replica id is folded into the seed: replicas draw different masks
    (replica 0 draws the masks a single-device run draws).
    """
    if not training or not rate:
        return x
    seed = seed_generator.next()  # [2] int64
    seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)  # as Keras
    replica = _replica_id()
    if replica is not None:
        seed = tf.random.experimental.stateless_fold_in(seed, replica)
    keep, kept_fraction = _keep_mask(tf.shape(x), rate, seed)
    return _masked_scale(x, keep, 1.0 / kept_fraction)


def _keep_mask(shape, rate, seed):
    """A Bernoulli keep mask (bool, `shape`) and its exact keep probability.

    Each element compares 16 random bits with round(rate·2¹⁶), so one 32-bit
    Philox draw serves two elements: the random-number kernel was the largest
    non-matmul cost of the step (6% of op time, scripts/bench_step.py --op_stats),
    and comparing integers also skips the int-to-float conversion of
    tf.nn.experimental.stateless_dropout. The rate is kept to within 2⁻¹⁷
    (0.1 drops with probability 6554/65536 = 0.100006), and the kept values are
    scaled by the exact inverse of the keep probability, so E[dropout(x)] = x.
    """
    size = tf.reduce_prod(shape)
    bits = tf.random.stateless_uniform(
        [(size + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32
    )
    halves = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]  # [size]
    threshold = min(max(round(rate * 2**16), 1), 2**16 - 1)
    keep = tf.reshape(halves >= tf.constant(threshold, tf.uint16), shape)
    return keep, 1.0 - threshold / 2**16


def _masked_scale(x, keep, scale):
    """where(keep, x·scale, 0) with a gradient of the same form: two element-wise
    passes each way and no full-size zeros tensor (tf.where's own gradient builds
    zeros_like(x) and selects against it)."""
    scale = tf.cast(scale, x.dtype)
    zero = tf.zeros([], x.dtype)

    @tf.custom_gradient
    def apply(value):
        def grad(upstream):
            return tf.where(keep, upstream * scale, zero)

        return tf.where(keep, value * scale, zero), grad

    return apply(x)


def _replica_id():
    """This replica's id in its sync group when it can be non-zero, else None."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    replica = context.replica_id_in_sync_group
    static = tf.get_static_value(replica)
    if static is not None and static == 0:
        return None
    return tf.cast(replica, tf.int32)


class LayerNormalization(keras.layers.LayerNormalization):
    """Keras's layer normalization over the last axis, with a hand-written gradient.

    The same weights (gamma, beta), names, config and checkpoint keys as Keras's
    layer, and like it computed in float32 whatever the compute dtype. Keras builds
    it from moments() and leaves the backward pass to autodiff: ~20 element-wise
    ops and broadcasts per norm, 8% of the float32 translation step's op time on a
    CPU without oneDNN (scripts/bench_step.py --op_stats). Here the forward pass is
    five element-wise passes and the backward pass uses the closed form
    dx = rstd · (dy − mean(dy) − y · mean(dy · y)), dy = upstream · gamma.
    """

    def call(self, inputs):
        last_axis_only = self.axis in (-1, [-1], [len(inputs.shape) - 1])
        if not last_axis_only or self.gamma is None or self.beta is None:
            return super().call(inputs)  # a form the Transformer does not use
        x = tf.cast(inputs, tf.float32)
        gamma = tf.convert_to_tensor(self.gamma)
        beta = tf.convert_to_tensor(self.beta)
        return tf.cast(_normalize(x, gamma, beta, self.epsilon), self.compute_dtype)


def _normalize(x, gamma, beta, epsilon):
    """(x − mean) / sqrt(var + epsilon) · gamma + beta over the last axis."""

    @tf.custom_gradient
    def normalize(x, gamma, beta):
        centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        rstd = tf.math.rsqrt(variance + epsilon)  # [..., 1]
        y = centered * rstd

        def grad(upstream):
            rows = _all_but_last_axis(upstream)
            d_gamma = tf.reduce_sum(upstream * y, axis=rows)
            d_beta = tf.reduce_sum(upstream, axis=rows)
            dy = upstream * gamma
            mean_dy = tf.reduce_mean(dy, axis=-1, keepdims=True)
            mean_dy_y = tf.reduce_mean(dy * y, axis=-1, keepdims=True)
            return rstd * (dy - mean_dy - y * mean_dy_y), d_gamma, d_beta

        return y * gamma + beta, grad

    return normalize(x, gamma, beta)


def _all_but_last_axis(x):
    """The axes of `x` but its last: a constant list when its rank is known, as in
    every traced Transformer, rather than ops computing it (six per norm, each
    paid again by every run's trace and Grappler)."""
    if x.shape.rank is not None:
        return list(range(x.shape.rank - 1))
    return tf.range(tf.rank(x) - 1)
