"""The Transformer's layers below the model: embeddings, positions, the feed-forward
block and the pre-norm encoder and decoder layers."""

import dataclasses
import math

import keras
import tensorflow as tf

from t2t_lite.constants import PAD_ID
from t2t_lite.models.attention import MultiHeadAttention, uniform_unit_scaling
from t2t_lite.models.config import as_config
from t2t_lite.models.kernels import LayerNormalization, dropout


def get_timing_signal_1d(
    length,
    channels,
    min_timescale=1.0,
    max_timescale=1.0e4,
    start_index=0,
    dtype=tf.float32,
):
    """T2T's sinusoidal timing signal: sin half then cos half. [1, length, channels].

    Computed in float32 (positions up to thousands need its precision), returned in
    `dtype`."""
    position = tf.cast(tf.range(length) + start_index, tf.float32)  # [length]
    num_timescales = channels // 2
    log_increment = math.log(float(max_timescale) / float(min_timescale)) / max(
        num_timescales - 1, 1
    )
    inv_timescales = min_timescale * tf.exp(
        tf.range(num_timescales, dtype=tf.float32) * -log_increment
    )
    scaled_time = position[:, None] * inv_timescales[None, :]  # [length, channels//2]
    signal = tf.concat([tf.sin(scaled_time), tf.cos(scaled_time)], axis=1)
    signal = tf.pad(signal, [[0, 0], [0, channels % 2]])  # [length, channels]
    return tf.cast(signal[None, :, :], dtype)  # [1, length, channels]


def shift_right(targets):
    """Decoder input ids: 0 at position 0, the last target dropped. [batch, length]."""
    targets = tf.convert_to_tensor(targets)
    return tf.pad(targets, [[0, 0], [1, 0]])[:, :-1]


def build_sublayers(sublayers, input_shape):
    """Builds those of `sublayers` not built yet, each from `input_shape`: a layer
    that builds its own this way creates its variables without the trace of call()
    in a scratch graph that Keras would otherwise build it with. (A sublayer may be
    built already: the model's encode() can run before its first call.)"""
    for sublayer in sublayers:
        if not sublayer.built:
            sublayer.build(input_shape)


class EmbeddingSharedWeights(keras.layers.Layer):
    """A [vocab, hidden] matrix used as embedding and/or softmax (mode "linear").

    Embedding: tf.gather (sparse gradient), times sqrt(hidden), padding (id 0) zeroed.
    Linear: logits = x @ W^T.

    Under a mixed policy the float32 matrix is cast by hand, not by Keras's autocast:
    autocast would cast the whole vocab×hidden matrix before the lookup and make the
    embedding gradient dense; gathering first keeps it an IndexedSlices of the rows
    used.
    """

    def __init__(self, vocab_size, hidden_size, **kwargs):
        super().__init__(autocast=False, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size

    def build(self, input_shape=None):
        self.weights_matrix = self.add_weight(
            name="weights",
            shape=(self.vocab_size, self.hidden_size),
            initializer=keras.initializers.RandomNormal(
                mean=0.0, stddev=self.hidden_size**-0.5
            ),
            dtype="float32",
        )

    def call(self, inputs, mode="embedding"):
        if mode == "embedding":
            return self._embed(inputs)
        if mode == "linear":
            return self._linear(inputs)
        raise ValueError(f"mode must be 'embedding' or 'linear', got {mode!r}")

    def _embed(self, ids):
        ids = tf.cast(ids, tf.int32)  # [batch, length]
        x = tf.gather(self.weights_matrix, ids)  # [batch, length, hidden]
        x = tf.cast(x, self.compute_dtype) * self.hidden_size**0.5
        return x * tf.cast(tf.not_equal(ids, PAD_ID), x.dtype)[:, :, None]

    def _linear(self, x):
        """x [..., hidden] -> logits [..., vocab]."""
        flat = tf.reshape(x, [-1, self.hidden_size])  # [positions, hidden]
        weights = tf.cast(self.weights_matrix, self.compute_dtype)
        logits = tf.matmul(tf.cast(flat, self.compute_dtype), weights, transpose_b=True)
        out_shape = tf.concat([tf.shape(x)[:-1], [self.vocab_size]], axis=0)
        return tf.reshape(logits, out_shape)  # [..., vocab]

    def get_config(self):
        names = ("vocab_size", "hidden_size")
        return {**super().get_config(), **{n: getattr(self, n) for n in names}}


class FeedForward(keras.layers.Layer):
    """T2T dense_relu_dense: dense(filter, relu) -> relu dropout -> dense(hidden)."""

    def __init__(self, config, **kwargs):
        config = as_config(config)
        super().__init__(**{"dtype": config.dtype_policy, **kwargs})
        self.config = config
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        gain = config.initializer_gain
        self.filter_dense = keras.layers.Dense(
            config.filter_size,
            activation="relu",
            kernel_initializer=uniform_unit_scaling(gain),
            dtype=config.dtype_policy,
            name="conv1",
        )
        self.output_dense = keras.layers.Dense(
            config.hidden_size,
            kernel_initializer=uniform_unit_scaling(gain),
            dtype=config.dtype_policy,
            name="conv2",
        )

    def build(self, input_shape=None):
        build_sublayers([self.filter_dense], (None, None, self.config.hidden_size))
        build_sublayers([self.output_dense], (None, None, self.config.filter_size))

    def call(self, x, training=False):
        h = self.filter_dense(x)  # [batch, length, filter]
        h = dropout(h, self.config.relu_dropout, training, self.seed_generator)
        return self.output_dense(h)  # [batch, length, hidden]

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config)}


def layer_norm(config, name):
    return LayerNormalization(
        epsilon=config.norm_epsilon, dtype=config.dtype_policy, name=name
    )


class _TransformerLayer(keras.layers.Layer):
    """What encoder and decoder layers share: the feed-forward sublayer and the
    residual. Attribute order is variable order, which checkpoints depend on."""

    def __init__(self, config, **kwargs):
        config = as_config(config)
        super().__init__(**{"dtype": config.dtype_policy, **kwargs})
        self.config = config
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        self.ffn = FeedForward(config, name="ffn")
        self.ffn_norm = layer_norm(config, "ffn_norm")

    def build(self, input_shape=None):
        build_sublayers(self.sublayers(), (None, None, self.config.hidden_size))

    def _residual(self, x, y, training):
        """Postprocess "da": dropout then residual add."""
        rate = self.config.layer_prepostprocess_dropout
        return x + dropout(y, rate, training, self.seed_generator)

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config)}


class EncoderLayer(_TransformerLayer):
    """Self-attention then feed-forward, each `x + dropout(f(layer_norm(x)))`."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.self_attention = MultiHeadAttention(self.config, name="self_attention")
        self.self_attention_norm = layer_norm(self.config, "self_attention_norm")

    def sublayers(self):
        return (self.self_attention_norm, self.self_attention, self.ffn_norm, self.ffn)

    def call(self, x, bias, training=False):
        """x [batch, length, hidden]; bias [batch, 1, 1, length]."""
        y = self.self_attention_norm(x)
        y, _ = self.self_attention(y, y, bias, training=training)
        x = self._residual(x, y, training)
        y = self.ffn(self.ffn_norm(x), training=training)
        return self._residual(x, y, training)  # [batch, length, hidden]


class DecoderLayer(_TransformerLayer):
    """Causal self-attention, encoder-decoder attention, feed-forward; each
    `x + dropout(f(layer_norm(x)))`. One code path with and without a cache."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.self_attention = MultiHeadAttention(self.config, name="self_attention")
        self.self_attention_norm = layer_norm(self.config, "self_attention_norm")
        self.encdec_attention = MultiHeadAttention(self.config, name="encdec_attention")
        self.encdec_attention_norm = layer_norm(self.config, "encdec_attention_norm")

    def sublayers(self):
        return (
            self.self_attention_norm,
            self.self_attention,
            self.encdec_attention_norm,
            self.encdec_attention,
            self.ffn_norm,
            self.ffn,
        )

    def call(
        self, x, encoder_output, self_bias, encdec_bias, training=False, cache=None
    ):
        """x [batch, new, hidden]: the decoder positions to compute;
        encoder_output [batch, src_len, hidden]; encdec_bias [batch, 1, 1, src_len];
        self_bias [1, new, t + new] (causal; t = 0 without a cache).

        cache None: x is the whole decoder input. cache {"self", "encdec"} (each
        {"k", "v"} [batch, heads, length, depth]): keys/values of the t positions
        before x and of the encoder output, which then need not be given (None).
        Returns (output [batch, new, hidden], cache including x's positions).
        """
        cache = cache or {"self": None, "encdec": None}
        y = self.self_attention_norm(x)
        y, self_kv = self.self_attention(
            y, memory=y, bias=self_bias, training=training, cache=cache["self"]
        )
        x = self._residual(x, y, training)
        memory = encoder_output if cache["encdec"] is None else None
        y, encdec_kv = self.encdec_attention(
            self.encdec_attention_norm(x),
            memory=memory,
            bias=encdec_bias,
            training=training,
            cache=cache["encdec"],
        )
        x = self._residual(x, y, training)
        y = self.ffn(self.ffn_norm(x), training=training)
        x = self._residual(x, y, training)  # [batch, new, hidden]
        return x, {"self": self_kv, "encdec": encdec_kv}
