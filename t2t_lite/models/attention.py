"""T2T's multi-head attention and the additive biases that mask it."""

import dataclasses

import keras
import tensorflow as tf

from t2t_lite.constants import NEG_INF, PAD_ID
from t2t_lite.models.config import as_config
from t2t_lite.models.kernels import dropout


def large_negative(dtype):
    """The additive attention bias that masks a position, representable in `dtype`:
    T2T's -1e9, or float16's lowest finite value (-65504) under float16."""
    dtype = tf.as_dtype(dtype)
    return max(NEG_INF, float(dtype.min))


def uniform_unit_scaling(gain):
    """T2T's "uniform unit scaling" (Glorot-uniform-like) with gain `gain`.

    A new initializer per weight: a Keras 3 initializer made without a seed draws
    its seed once, so one instance shared by several Dense layers gives them
    identical initial values (the q, k, v and output kernels of every attention
    layer would start equal). Each instance's seed comes from
    keras.utils.set_random_seed's global state, so runs stay reproducible.
    """
    return keras.initializers.VarianceScaling(
        scale=gain, mode="fan_avg", distribution="uniform"
    )


def attention_bias_ignore_padding(ids, dtype=tf.float32):
    """-1e9 on padding keys (id 0), in `dtype`. [batch, 1, 1, length]."""
    padding = tf.cast(tf.equal(ids, PAD_ID), dtype)  # [batch, length]
    return (padding * large_negative(dtype))[:, None, None, :]


def attention_bias_lower_triangle(length, dtype=tf.float32):
    """Causal bias: -1e9 where the key is after the query, in `dtype`.
    [1, length, length].

    Three dimensions, not T2T's [1, 1, length, length]: both broadcast over batch and
    heads alike, but with the 4-D one TF's oneDNN CPU kernels run an inference-only
    forward pass 6-100x slower (evaluation, uncached decoding); training is not
    affected (scripts/bench_decoding.py, docs/benchmarks.md)."""
    allowed = tf.linalg.band_part(tf.ones([length, length], dtype), -1, 0)
    return ((1.0 - allowed) * large_negative(dtype))[None, :, :]


class MultiHeadAttention(keras.layers.Layer):
    """T2T dot-product multi-head attention; q/k/v/output projections without bias."""

    def __init__(self, config, **kwargs):
        config = as_config(config)
        super().__init__(**{"dtype": config.dtype_policy, **kwargs})
        self.config = config
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        self.num_heads = config.num_heads
        self.depth = config.hidden_size // config.num_heads

        def dense(name):
            return keras.layers.Dense(
                config.hidden_size,
                use_bias=False,
                kernel_initializer=uniform_unit_scaling(config.initializer_gain),
                dtype=config.dtype_policy,
                name=name,
            )

        self.q_dense, self.k_dense = dense("q"), dense("k")
        self.v_dense, self.output_dense = dense("v"), dense("output_transform")

    def build(self, query_shape=None, *args, **kwargs):
        # The projections' kernels are read directly (see _project_heads), so they
        # must exist before the first call, not when a Dense is first called.
        for dense in (self.q_dense, self.k_dense, self.v_dense):
            dense.build((None, None, self.config.hidden_size))
        self.output_dense.build((None, None, self.config.hidden_size))

    def _project_heads(self, x, denses, scales):
        """x [batch, length, hidden] through several bias-free projections in ONE
        matmul (their kernels side by side, each times its scale), split into heads:
        per dense [batch, heads, length, depth].

        Self-attention's q, k, v (and encoder-decoder attention's k, v) then cost one
        [positions, hidden] x [hidden, 3·hidden] matmul and one transpose each way
        instead of three; the weights stay three checkpointed Dense kernels.
        Folding the query scale into the kernel saves a pass over q.
        """
        kernels = [
            dense.kernel if scale == 1 else dense.kernel * scale
            for dense, scale in zip(denses, scales)
        ]
        kernel = tf.concat(kernels, axis=1)  # [hidden, len(denses) * hidden]
        kernel = tf.cast(kernel, self.compute_dtype)
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        flat = tf.reshape(tf.cast(x, self.compute_dtype), [-1, self.config.hidden_size])
        y = tf.matmul(flat, kernel)  # [positions, len(denses) * hidden]
        y = tf.reshape(y, [batch, length, len(denses), self.num_heads, self.depth])
        y = tf.transpose(y, [2, 0, 3, 1, 4])  # [len(denses), batch, heads, len, depth]
        return tf.unstack(y, num=len(denses))

    def _combine_heads(self, x):
        """[batch, heads, length, depth] -> [batch, length, hidden]."""
        x = tf.transpose(x, [0, 2, 1, 3])
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.reshape(x, [batch, length, self.config.hidden_size])

    def keys_values(self, memory):
        """memory [batch, m_len, hidden] -> {"k", "v"} [batch, heads, m_len, depth]."""
        k, v = self._project_heads(memory, [self.k_dense, self.v_dense], [1.0, 1.0])
        return {"k": k, "v": v}

    def call(self, query, memory, bias, training=False, cache=None):
        """query [batch, q_len, hidden] attends over memory [batch, m_len, hidden];
        bias broadcasts to [batch, heads, q_len, k_len].

        cache (incremental decoding): {"k", "v"} [batch, heads, t, depth] of t earlier
        memory positions; memory's are appended to them, or with memory None the
        cache is all the memory. Returns (output [batch, q_len, hidden], the
        {"k", "v"} attended over: the next step's cache).
        """
        query_scale = self.depth**-0.5
        if memory is query:  # self-attention: q, k, v in one matmul
            q, k, v = self._project_heads(
                query, [self.q_dense, self.k_dense, self.v_dense], [query_scale, 1, 1]
            )  # [batch, heads, length, depth] each
            kv = {"k": k, "v": v}
        else:
            (q,) = self._project_heads(query, [self.q_dense], [query_scale])
            if memory is None:  # the cache is the whole memory
                kv, cache = cache, None
            else:
                kv = self.keys_values(memory)
        if cache is not None:  # self-attention: new positions after cached ones
            kv = {key: tf.concat([cache[key], kv[key]], axis=2) for key in kv}
        logits = tf.matmul(q, kv["k"], transpose_b=True)  # [.., q_len, k_len]
        weights = tf.nn.softmax(logits + tf.cast(bias, logits.dtype))
        rate = self.config.attention_dropout
        weights = dropout(weights, rate, training, self.seed_generator)
        out = tf.matmul(weights, kv["v"])  # [batch, heads, q_len, depth]
        return self.output_dense(self._combine_heads(out)), kv

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config)}
