"""T2T's Transformer encoder-decoder as Keras 3 layers on TensorFlow ops.

Only `Transformer.from_hparams` reads hparams. Ids: 0 is padding, 1 is EOS. Padding
never leaks: a sequence gives the same outputs alone or batched with longer ones.
"""

import math

import keras
import tensorflow as tf

NEG_INF = -1e9  # T2T's large negative attention bias for masked positions.


def _dropout(x, rate, training, seed_generator):
    """Dropout, an exact no-op unless training with rate > 0.

    Masks come from the layer's keras.random.SeedGenerator: seeded by
    keras.utils.set_random_seed, and its state is checkpointed (see
    `Transformer.rng_state`), so a resumed run draws the masks an uninterrupted run
    would have drawn.
    """
    if not training or not rate:
        return x
    return keras.random.dropout(x, rate=rate, seed=seed_generator)


def _uniform_unit_scaling(gain):
    """T2T's "uniform unit scaling" (Glorot-uniform-like) with gain `gain`."""
    return keras.initializers.VarianceScaling(
        scale=gain, mode="fan_avg", distribution="uniform"
    )


def get_timing_signal_1d(
    length, channels, min_timescale=1.0, max_timescale=1.0e4, start_index=0
):
    """T2T's sinusoidal timing signal: sin half then cos half. [1, length, channels]."""
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
    return signal[None, :, :]  # [1, length, channels]


def attention_bias_ignore_padding(ids):
    """-1e9 on padding keys (id 0). [batch, 1, 1, length]."""
    padding = tf.cast(tf.equal(ids, 0), tf.float32)  # [batch, length]
    return (padding * NEG_INF)[:, None, None, :]


def attention_bias_lower_triangle(length):
    """Causal bias: -1e9 where the key is after the query. [1, length, length].

    Three dimensions, not T2T's [1, 1, length, length]: both broadcast over batch and
    heads alike, but with the 4-D one TF's oneDNN CPU kernels run an inference-only
    forward pass 6-100x slower (evaluation, uncached decoding); training is not
    affected. Measured in scripts/bench_decoding.py's notes and README."""
    allowed = tf.linalg.band_part(tf.ones([length, length]), -1, 0)
    return ((1.0 - allowed) * NEG_INF)[None, :, :]


def shift_right(targets):
    """Decoder input ids: 0 at position 0, the last target dropped. [batch, length]."""
    targets = tf.convert_to_tensor(targets)
    return tf.pad(targets, [[0, 0], [1, 0]])[:, :-1]


class EmbeddingSharedWeights(keras.layers.Layer):
    """A [vocab, hidden] matrix used as embedding and/or softmax (mode "linear").

    Embedding: tf.gather (sparse gradient), times sqrt(hidden), padding (id 0) zeroed.
    Linear: logits = x @ W^T.
    """

    def __init__(self, vocab_size, hidden_size, **kwargs):
        super().__init__(**kwargs)
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
        x *= self.hidden_size**0.5
        return x * tf.cast(tf.not_equal(ids, 0), x.dtype)[:, :, None]

    def _linear(self, x):
        """x [..., hidden] -> logits [..., vocab]."""
        flat = tf.reshape(x, [-1, self.hidden_size])  # [positions, hidden]
        logits = tf.matmul(flat, self.weights_matrix, transpose_b=True)
        out_shape = tf.concat([tf.shape(x)[:-1], [self.vocab_size]], axis=0)
        return tf.reshape(logits, out_shape)  # [..., vocab]

    def get_config(self):
        names = ("vocab_size", "hidden_size")
        return {**super().get_config(), **{n: getattr(self, n) for n in names}}


class MultiHeadAttention(keras.layers.Layer):
    """T2T dot-product multi-head attention; q/k/v/output projections without bias."""

    def __init__(
        self, hidden_size, num_heads, attention_dropout, initializer_gain=1.0, **kwargs
    ):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        if hidden_size % num_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by "
                f"num_heads ({num_heads})"
            )
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        self.initializer_gain = initializer_gain
        init = _uniform_unit_scaling(initializer_gain)

        def dense(name):
            return keras.layers.Dense(
                hidden_size, use_bias=False, kernel_initializer=init, name=name
            )

        self.q_dense, self.k_dense = dense("q"), dense("k")
        self.v_dense, self.output_dense = dense("v"), dense("output_transform")

    def _split_heads(self, x):
        """[batch, length, hidden] -> [batch, heads, length, hidden/heads]."""
        depth = self.hidden_size // self.num_heads
        x = tf.reshape(x, [tf.shape(x)[0], tf.shape(x)[1], self.num_heads, depth])
        return tf.transpose(x, [0, 2, 1, 3])

    def _combine_heads(self, x):
        """[batch, heads, length, hidden/heads] -> [batch, length, hidden]."""
        x = tf.transpose(x, [0, 2, 1, 3])
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.reshape(x, [batch, length, self.hidden_size])

    def keys_values(self, memory):
        """memory [batch, k_len, hidden] -> (keys, values), each
        [batch, heads, k_len, depth]. Decoding caches these (see DecoderLayer)."""
        return (
            self._split_heads(self.k_dense(memory)),
            self._split_heads(self.v_dense(memory)),
        )

    def call(self, query, memory, bias, training=False):
        """query [batch, q_len, hidden], memory [batch, k_len, hidden],
        bias broadcastable to [batch, heads, q_len, k_len]."""
        keys, values = self.keys_values(memory)
        return self.attend(query, keys, values, bias, training=training)

    def attend(self, query, keys, values, bias, training=False):
        """Attention of query [batch, q_len, hidden] over already projected keys and
        values [batch, heads, k_len, depth] -> [batch, q_len, hidden]."""
        q = self._split_heads(self.q_dense(query))  # [batch, heads, q_len, depth]
        k, v = keys, values
        q *= (self.hidden_size // self.num_heads) ** -0.5
        logits = tf.matmul(q, k, transpose_b=True)  # [batch, heads, q_len, k_len]
        weights = tf.nn.softmax(logits + bias)
        weights = _dropout(
            weights, self.attention_dropout, training, self.seed_generator
        )
        out = tf.matmul(weights, v)  # [batch, heads, q_len, depth]
        return self.output_dense(self._combine_heads(out))  # [batch, q_len, hidden]

    def get_config(self):
        names = ("hidden_size", "num_heads", "attention_dropout", "initializer_gain")
        return {**super().get_config(), **{n: getattr(self, n) for n in names}}


class FeedForward(keras.layers.Layer):
    """T2T dense_relu_dense: dense(filter, relu) -> relu dropout -> dense(hidden)."""

    def __init__(
        self, hidden_size, filter_size, relu_dropout, initializer_gain=1.0, **kwargs
    ):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        self.hidden_size = hidden_size
        self.filter_size = filter_size
        self.relu_dropout = relu_dropout
        self.initializer_gain = initializer_gain
        init = _uniform_unit_scaling(initializer_gain)
        self.filter_dense = keras.layers.Dense(
            filter_size, activation="relu", kernel_initializer=init, name="conv1"
        )
        self.output_dense = keras.layers.Dense(
            hidden_size, kernel_initializer=init, name="conv2"
        )

    def call(self, x, training=False):
        h = self.filter_dense(x)  # [batch, length, filter]
        h = _dropout(h, self.relu_dropout, training, self.seed_generator)
        return self.output_dense(h)  # [batch, length, hidden]

    def get_config(self):
        names = ("hidden_size", "filter_size", "relu_dropout", "initializer_gain")
        return {**super().get_config(), **{n: getattr(self, n) for n in names}}


class _TransformerLayerBase(keras.layers.Layer):
    """Shared arguments, config, feed-forward and residual of encoder/decoder layers."""

    def __init__(
        self,
        hidden_size,
        filter_size,
        num_heads,
        layer_prepostprocess_dropout,
        attention_dropout,
        relu_dropout,
        norm_epsilon=1e-6,
        initializer_gain=1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        self.hidden_size = hidden_size
        self.filter_size = filter_size
        self.num_heads = num_heads
        self.layer_prepostprocess_dropout = layer_prepostprocess_dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.norm_epsilon = norm_epsilon
        self.initializer_gain = initializer_gain
        self.ffn = FeedForward(
            hidden_size, filter_size, relu_dropout, initializer_gain, name="ffn"
        )
        self.ffn_norm = self._norm("ffn_norm")

    def _attention(self, name):
        return MultiHeadAttention(
            self.hidden_size,
            self.num_heads,
            self.attention_dropout,
            self.initializer_gain,
            name=name,
        )

    def _norm(self, name):
        return keras.layers.LayerNormalization(epsilon=self.norm_epsilon, name=name)

    def _residual(self, x, y, training):
        """Postprocess "da": dropout then residual add."""
        return x + _dropout(
            y, self.layer_prepostprocess_dropout, training, self.seed_generator
        )

    def get_config(self):
        names = (
            "hidden_size",
            "filter_size",
            "num_heads",
            "layer_prepostprocess_dropout",
            "attention_dropout",
            "relu_dropout",
            "norm_epsilon",
            "initializer_gain",
        )
        return {**super().get_config(), **{n: getattr(self, n) for n in names}}


class EncoderLayer(_TransformerLayerBase):
    """Self-attention then feed-forward, each `x + dropout(f(layer_norm(x)))`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attention = self._attention("self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")

    def call(self, x, bias, training=False):
        """x [batch, length, hidden]; bias [batch, 1, 1, length]."""
        y = self.self_attention_norm(x)
        x = self._residual(
            x, self.self_attention(y, y, bias, training=training), training
        )
        y = self.ffn(self.ffn_norm(x), training=training)
        return self._residual(x, y, training)  # [batch, length, hidden]


class DecoderLayer(_TransformerLayerBase):
    """Causal self-attention, encoder-decoder attention, feed-forward; each
    `x + dropout(f(layer_norm(x)))`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attention = self._attention("self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        self.encdec_attention = self._attention("encdec_attention")
        self.encdec_attention_norm = self._norm("encdec_attention_norm")

    def call(self, x, encoder_output, self_bias, encoder_decoder_bias, training=False):
        """x [batch, tgt_len, hidden]; encoder_output [batch, src_len, hidden];
        self_bias [1, tgt_len, tgt_len];
        encoder_decoder_bias [batch, 1, 1, src_len]."""
        y = self.self_attention_norm(x)
        x = self._residual(
            x, self.self_attention(y, y, self_bias, training=training), training
        )
        y = self.encdec_attention(
            self.encdec_attention_norm(x),
            encoder_output,
            encoder_decoder_bias,
            training=training,
        )
        x = self._residual(x, y, training)
        y = self.ffn(self.ffn_norm(x), training=training)
        return self._residual(x, y, training)  # [batch, tgt_len, hidden]

    def empty_self_cache(self, batch_size):
        """Self-attention keys/values of no position yet: {"k", "v"}
        [batch, heads, 0, depth]; each decode_step appends one position."""
        depth = self.hidden_size // self.num_heads
        empty = tf.zeros([batch_size, self.num_heads, 0, depth])
        return {"k": empty, "v": empty}

    def decode_step(self, x, self_cache, encdec_cache, encdec_bias):
        """`call` for the next position only, reusing cached keys/values.

        x [batch, 1, hidden]; self_cache {"k", "v"} [batch, heads, t, depth] holds the
        t positions before this one (all of them visible: no causal mask needed);
        encdec_cache (keys, values) of the encoder output.
        Returns (output [batch, 1, hidden], self_cache grown to t + 1 positions).
        """
        y = self.self_attention_norm(x)
        new_k, new_v = self.self_attention.keys_values(y)  # [batch, heads, 1, depth]
        self_cache = {
            "k": tf.concat([self_cache["k"], new_k], axis=2),
            "v": tf.concat([self_cache["v"], new_v], axis=2),
        }
        y = self.self_attention.attend(y, self_cache["k"], self_cache["v"], 0.0)
        x += y
        y = self.encdec_attention.attend(
            self.encdec_attention_norm(x), *encdec_cache, encdec_bias
        )
        x += y
        x += self.ffn(self.ffn_norm(x))
        return x, self_cache  # [batch, 1, hidden]


class Transformer(keras.Model):
    """T2T Transformer: features {"inputs", "targets"} (int ids) -> logits.

    call() returns float32 logits [batch, tgt_len, vocab]. `encode` and `decode` are
    public so decoding (greedy, beam search) can reuse them.
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        filter_size,
        num_encoder_layers,
        num_decoder_layers,
        num_heads,
        layer_prepostprocess_dropout,
        attention_dropout,
        relu_dropout,
        shared_embedding_and_softmax_weights,
        norm_epsilon=1e-6,
        initializer_gain=1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.filter_size = filter_size
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.num_heads = num_heads
        self.layer_prepostprocess_dropout = layer_prepostprocess_dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.shared_embedding_and_softmax_weights = bool(
            shared_embedding_and_softmax_weights
        )
        self.norm_epsilon = norm_epsilon
        self.initializer_gain = initializer_gain
        self._build_sublayers()

    def _build_sublayers(self):
        def embedding(name):
            return EmbeddingSharedWeights(self.vocab_size, self.hidden_size, name=name)

        if self.shared_embedding_and_softmax_weights:
            shared = embedding("shared_embedding")
            self.source_embedding = self.target_embedding = self.softmax = shared
        else:
            self.source_embedding = embedding("source_embedding")
            self.target_embedding = embedding("target_embedding")
            self.softmax = embedding("softmax")
        args = (
            self.hidden_size,
            self.filter_size,
            self.num_heads,
            self.layer_prepostprocess_dropout,
            self.attention_dropout,
            self.relu_dropout,
            self.norm_epsilon,
            self.initializer_gain,
        )
        self.encoder_layers = [
            EncoderLayer(*args, name=f"encoder_layer_{i}")
            for i in range(self.num_encoder_layers)
        ]
        self.decoder_layers = [
            DecoderLayer(*args, name=f"decoder_layer_{i}")
            for i in range(self.num_decoder_layers)
        ]
        # tf.train.Checkpoint does not see layers inside a Keras 3 list attribute: a
        # model-only checkpoint would hold the embeddings and final norms, and
        # tf.train.Checkpoint(model=...) would restore those alone, silently. One
        # attribute per layer puts every weight under model/ in the checkpoint.
        for layer in self.encoder_layers + self.decoder_layers:
            setattr(self, layer.name, layer)
        self.encoder_norm = keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, name="encoder_norm"
        )
        self.decoder_norm = keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, name="decoder_norm"
        )

    @classmethod
    def from_hparams(cls, hp, vocab_size, **kwargs):
        """The only place hparams are read. num_*_layers 0 means num_hidden_layers."""
        return cls(
            vocab_size=vocab_size,
            hidden_size=hp.hidden_size,
            filter_size=hp.filter_size,
            num_encoder_layers=hp.num_encoder_layers or hp.num_hidden_layers,
            num_decoder_layers=hp.num_decoder_layers or hp.num_hidden_layers,
            num_heads=hp.num_heads,
            layer_prepostprocess_dropout=hp.layer_prepostprocess_dropout,
            attention_dropout=hp.attention_dropout,
            relu_dropout=hp.relu_dropout,
            shared_embedding_and_softmax_weights=bool(
                hp.shared_embedding_and_softmax_weights
            ),
            norm_epsilon=hp.norm_epsilon,
            initializer_gain=hp.initializer_gain,
            **kwargs,
        )

    def _add_timing_and_dropout(self, x, training):
        """x [batch, length, hidden] (already scaled): + sinusoid, then dropout."""
        x += get_timing_signal_1d(tf.shape(x)[1], self.hidden_size)
        return _dropout(
            x, self.layer_prepostprocess_dropout, training, self.seed_generator
        )

    def encode(self, inputs, training=False):
        """inputs int [batch, src_len] -> (encoder_output [batch, src_len, hidden],
        encoder_decoder_bias [batch, 1, 1, src_len], -1e9 on source padding)."""
        inputs = tf.cast(inputs, tf.int32)
        bias = attention_bias_ignore_padding(inputs)  # [batch, 1, 1, src_len]
        x = self.source_embedding(inputs)  # [batch, src_len, hidden]
        x = self._add_timing_and_dropout(x, training)
        for layer in self.encoder_layers:
            x = layer(x, bias, training=training)
        return self.encoder_norm(x), bias

    def decode(
        self, decoder_input_ids, encoder_output, encoder_decoder_bias, training=False
    ):
        """decoder_input_ids int [batch, tgt_len], ALREADY shifted right (see
        shift_right: position 0 holds 0) -> float32 logits [batch, tgt_len, vocab].
        Logits at position i predict target i from decoder inputs 0..i."""
        ids = tf.cast(decoder_input_ids, tf.int32)
        self_bias = attention_bias_lower_triangle(tf.shape(ids)[1])  # [1, t, t]
        x = self.target_embedding(ids)  # [batch, tgt_len, hidden]
        x = self._add_timing_and_dropout(x, training)
        for layer in self.decoder_layers:
            x = layer(
                x, encoder_output, self_bias, encoder_decoder_bias, training=training
            )
        x = self.decoder_norm(x)  # [batch, tgt_len, hidden]
        logits = self.softmax(x, mode="linear")  # [batch, tgt_len, vocab]
        return tf.cast(logits, tf.float32)

    # --- incremental decoding (decoding/search.py drives these) ---------------------

    def encoder_decoder_cache(self, encoder_output):
        """Per decoder layer, the (keys, values) of the encoder output
        [batch, heads, src_len, depth]: computed once per sentence, not per step."""
        return [
            layer.encdec_attention.keys_values(encoder_output)
            for layer in self.decoder_layers
        ]

    def empty_self_cache(self, batch_size):
        """Per decoder layer, self-attention keys/values of no position yet."""
        return [layer.empty_self_cache(batch_size) for layer in self.decoder_layers]

    def decode_step(self, ids, index, self_cache, encdec_cache, encoder_decoder_bias):
        """Logits for position `index` only, from cached keys/values.

        ids int [batch]: the decoder input at `index` (0 at index 0, then the previous
        output); self_cache from `empty_self_cache` or the previous step (holding
        positions 0..index-1); encdec_cache from `encoder_decoder_cache`. Gives the
        logits `decode` gives at `index` (to float tolerance) without recomputing
        positions < index. Returns (float32 logits [batch, vocab], self_cache grown
        by one position).
        """
        x = self.target_embedding(tf.cast(ids, tf.int32)[:, None])  # [batch, 1, hidden]
        x += get_timing_signal_1d(1, self.hidden_size, start_index=index)
        new_cache = []
        for layer, cache, encdec in zip(self.decoder_layers, self_cache, encdec_cache):
            x, cache = layer.decode_step(x, cache, encdec, encoder_decoder_bias)
            new_cache.append(cache)
        x = self.decoder_norm(x)
        logits = self.softmax(x, mode="linear")[:, 0, :]  # [batch, vocab]
        return tf.cast(logits, tf.float32), new_cache

    def call(self, features, training=False):
        """features {"inputs": [batch, src_len], "targets": [batch, tgt_len]} int ids
        -> float32 logits [batch, tgt_len, vocab] (teacher forcing)."""
        encoder_output, bias = self.encode(features["inputs"], training=training)
        decoder_input_ids = shift_right(tf.cast(features["targets"], tf.int32))
        return self.decode(decoder_input_ids, encoder_output, bias, training=training)

    def get_config(self):
        names = (
            "vocab_size",
            "hidden_size",
            "filter_size",
            "num_encoder_layers",
            "num_decoder_layers",
            "num_heads",
            "layer_prepostprocess_dropout",
            "attention_dropout",
            "relu_dropout",
            "shared_embedding_and_softmax_weights",
            "norm_epsilon",
            "initializer_gain",
        )
        return {**super().get_config(), **{n: getattr(self, n) for n in names}}


def _nonpad_weights(targets):
    """1.0 on real target tokens, 0.0 on padding (id 0). [batch, length]."""
    return tf.cast(tf.not_equal(targets, 0), tf.float32)


def token_loss(logits, targets, label_smoothing):
    """T2T label-smoothed cross entropy, summed over non-pad tokens.

    logits [batch, length, vocab]; targets int [batch, length]. The true id gets
    1 - label_smoothing, the other vocab-1 ids share label_smoothing; the minimum
    (entropy of that distribution) is subtracted so the best prediction scores 0.
    Returns (loss_sum, num_tokens), float32 scalars, NOT normalized.
    """
    logits = tf.cast(logits, tf.float32)
    targets = tf.cast(targets, tf.int32)
    vocab_size = logits.shape[-1] or tf.shape(logits)[-1]
    vocab_f = tf.cast(vocab_size, tf.float32)
    confidence = 1.0 - label_smoothing
    low_confidence = (1.0 - confidence) / (vocab_f - 1.0)
    normalizing = -(
        confidence * tf.math.log(confidence)
        + (vocab_f - 1.0) * low_confidence * tf.math.log(low_confidence + 1e-20)
    )
    soft_targets = tf.one_hot(
        targets, depth=vocab_size, on_value=confidence, off_value=low_confidence
    )  # [batch, length, vocab]
    xent = tf.nn.softmax_cross_entropy_with_logits(labels=soft_targets, logits=logits)
    weights = _nonpad_weights(targets)  # [batch, length]
    loss_sum = tf.reduce_sum((xent - normalizing) * weights)
    return loss_sum, tf.reduce_sum(weights)


def token_accuracy(logits, targets):
    """Padding-aware accuracy counts, float32 scalars:
    (num_correct_tokens, num_tokens, num_correct_sequences, num_sequences).

    A sequence is correct when all its non-pad tokens are (T2T's
    padded_sequence_accuracy); sequences made only of padding are not counted.
    """
    targets = tf.cast(targets, tf.int32)
    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [batch, length]
    weights = _nonpad_weights(targets)
    correct = tf.cast(tf.equal(predictions, targets), tf.float32) * weights
    wrong_per_sequence = tf.reduce_sum(weights - correct, axis=-1)  # [batch]
    nonempty = tf.cast(tf.reduce_sum(weights, axis=-1) > 0, tf.float32)  # [batch]
    correct_sequences = tf.cast(tf.equal(wrong_per_sequence, 0), tf.float32) * nonempty
    return (
        tf.reduce_sum(correct),
        tf.reduce_sum(weights),
        tf.reduce_sum(correct_sequences),
        tf.reduce_sum(nonempty),
    )
