"""T2T's Transformer encoder-decoder as Keras 3 layers on TensorFlow ops.

Only `Transformer.from_hparams` reads hparams; it builds the one `TransformerConfig`
every layer takes. Ids: 0 is padding, 1 is EOS. Padding never leaks: a sequence gives
the same outputs alone or batched with longer ones.
"""

import dataclasses
import math

import keras
import tensorflow as tf

from t2t_lite.constants import NEG_INF, PAD_ID
from t2t_lite.hparams_checks import check_transformer_hparams
from t2t_lite.models.kernels import LayerNormalization, dropout
from t2t_lite.models.recompute import recomputed


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Every size and rate of a Transformer (Flax's examples do the same).

    `Transformer.from_hparams` builds it; layers take it whole and read what they need.
    """

    vocab_size: int
    hidden_size: int
    filter_size: int
    num_encoder_layers: int
    num_decoder_layers: int
    num_heads: int
    layer_prepostprocess_dropout: float
    attention_dropout: float
    relu_dropout: float
    shared_embedding_and_softmax_weights: bool
    norm_epsilon: float = 1e-6
    initializer_gain: float = 1.0
    # The compute dtype: float32, bfloat16 or float16. Variables stay float32 (Keras's
    # "mixed_*" policies); logits are returned as float32.
    activation_dtype: str = "float32"
    # Recompute each encoder/decoder layer's activations in the backward pass instead
    # of keeping them (models/recompute.py): less memory, one more forward pass.
    recompute_grad: bool = False

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.activation_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                "activation_dtype must be float32, bfloat16 or float16, got "
                f"{self.activation_dtype!r}"
            )

    @property
    def dtype_policy(self):
        """The Keras dtype policy every layer is built with: float32 variables, and
        computations in activation_dtype."""
        if self.activation_dtype == "float32":
            return "float32"
        return f"mixed_{self.activation_dtype}"


def _as_config(config):
    """A TransformerConfig, or the dict `get_config` made of one -> TransformerConfig."""
    if isinstance(config, TransformerConfig):
        return config
    return TransformerConfig(**config)


def large_negative(dtype):
    """The additive attention bias that masks a position, representable in `dtype`:
    T2T's -1e9, or float16's lowest finite value (-65504) under float16."""
    dtype = tf.as_dtype(dtype)
    return max(NEG_INF, float(dtype.min))


def _uniform_unit_scaling(gain):
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


def shift_right(targets):
    """Decoder input ids: 0 at position 0, the last target dropped. [batch, length]."""
    targets = tf.convert_to_tensor(targets)
    return tf.pad(targets, [[0, 0], [1, 0]])[:, :-1]


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


class MultiHeadAttention(keras.layers.Layer):
    """T2T dot-product multi-head attention; q/k/v/output projections without bias."""

    def __init__(self, config, **kwargs):
        config = _as_config(config)
        super().__init__(**{"dtype": config.dtype_policy, **kwargs})
        self.config = config
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        self.num_heads = config.num_heads
        self.depth = config.hidden_size // config.num_heads

        def dense(name):
            return keras.layers.Dense(
                config.hidden_size,
                use_bias=False,
                kernel_initializer=_uniform_unit_scaling(config.initializer_gain),
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


class FeedForward(keras.layers.Layer):
    """T2T dense_relu_dense: dense(filter, relu) -> relu dropout -> dense(hidden)."""

    def __init__(self, config, **kwargs):
        config = _as_config(config)
        super().__init__(**{"dtype": config.dtype_policy, **kwargs})
        self.config = config
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        gain = config.initializer_gain
        self.filter_dense = keras.layers.Dense(
            config.filter_size,
            activation="relu",
            kernel_initializer=_uniform_unit_scaling(gain),
            dtype=config.dtype_policy,
            name="conv1",
        )
        self.output_dense = keras.layers.Dense(
            config.hidden_size,
            kernel_initializer=_uniform_unit_scaling(gain),
            dtype=config.dtype_policy,
            name="conv2",
        )

    def call(self, x, training=False):
        h = self.filter_dense(x)  # [batch, length, filter]
        h = dropout(h, self.config.relu_dropout, training, self.seed_generator)
        return self.output_dense(h)  # [batch, length, hidden]

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config)}


def _layer_norm(config, name):
    return LayerNormalization(
        epsilon=config.norm_epsilon, dtype=config.dtype_policy, name=name
    )


class _TransformerLayer(keras.layers.Layer):
    """What encoder and decoder layers share: the feed-forward sublayer and the
    residual. Attribute order is variable order, which checkpoints depend on."""

    def __init__(self, config, **kwargs):
        config = _as_config(config)
        super().__init__(**{"dtype": config.dtype_policy, **kwargs})
        self.config = config
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks
        self.ffn = FeedForward(config, name="ffn")
        self.ffn_norm = _layer_norm(config, "ffn_norm")

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
        self.self_attention_norm = _layer_norm(self.config, "self_attention_norm")

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
        self.self_attention_norm = _layer_norm(self.config, "self_attention_norm")
        self.encdec_attention = MultiHeadAttention(self.config, name="encdec_attention")
        self.encdec_attention_norm = _layer_norm(self.config, "encdec_attention_norm")

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


class Transformer(keras.Model):
    """T2T Transformer: features {"inputs", "targets"} (int ids) -> logits.

    call() returns float32 logits [batch, tgt_len, vocab]. `encode`, `decode` and the
    cached `decode_step` are public so decoding (greedy, beam search) can reuse them.
    """

    def __init__(self, config, **kwargs):
        """config: a TransformerConfig (or its `dataclasses.asdict`)."""
        config = _as_config(config)
        super().__init__(**{"dtype": config.dtype_policy, **kwargs})
        self.config = config
        self.seed_generator = keras.random.SeedGenerator()  # dropout masks

        def embedding(name):
            return EmbeddingSharedWeights(
                config.vocab_size,
                config.hidden_size,
                dtype=config.dtype_policy,
                name=name,
            )

        if config.shared_embedding_and_softmax_weights:
            shared = embedding("shared_embedding")
            self.source_embedding = self.target_embedding = self.softmax = shared
        else:
            self.source_embedding = embedding("source_embedding")
            self.target_embedding = embedding("target_embedding")
            self.softmax = embedding("softmax")
        self.encoder_layers = [
            EncoderLayer(config, name=f"encoder_layer_{i}")
            for i in range(config.num_encoder_layers)
        ]
        self.decoder_layers = [
            DecoderLayer(config, name=f"decoder_layer_{i}")
            for i in range(config.num_decoder_layers)
        ]
        # tf.train.Checkpoint does not see layers inside a Keras 3 list attribute: a
        # model-only checkpoint would hold the embeddings and final norms, and
        # tf.train.Checkpoint(model=...) would restore those alone, silently. One
        # attribute per layer puts every weight under model/ in the checkpoint.
        # (Attribute names are checkpoint keys; their order is the variables' order.)
        for layer in self.encoder_layers + self.decoder_layers:
            setattr(self, layer.name, layer)
        self.encoder_norm = _layer_norm(config, "encoder_norm")
        self.decoder_norm = _layer_norm(config, "decoder_norm")

    @classmethod
    def validate_hparams(cls, hp):
        """Range checks of the keys from_hparams reads (hparams_checks.validate)."""
        check_transformer_hparams(hp)

    @classmethod
    def from_hparams(cls, hp, vocab_size, **kwargs):
        """The only place hparams are read. num_*_layers 0 means num_hidden_layers."""
        config = TransformerConfig(
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
            activation_dtype=hp.activation_dtype,
            recompute_grad=bool(hp.recompute_grad),
        )
        return cls(config, **kwargs)

    @property
    def vocab_size(self):
        return self.config.vocab_size

    def _add_timing_and_dropout(self, x, training, start_index=0):
        """x [batch, length, hidden] (already scaled) at positions start_index..:
        + sinusoid, then dropout."""
        hidden = self.config.hidden_size
        x += get_timing_signal_1d(
            tf.shape(x)[1], hidden, start_index=start_index, dtype=x.dtype
        )
        rate = self.config.layer_prepostprocess_dropout
        return dropout(x, rate, training, self.seed_generator)

    def encode(self, inputs, training=False):
        """inputs int [batch, src_len] -> (encoder_output [batch, src_len, hidden],
        encoder_decoder_bias [batch, 1, 1, src_len], -1e9 on source padding)."""
        inputs = tf.cast(inputs, tf.int32)
        # [batch, 1, 1, src_len]
        bias = attention_bias_ignore_padding(inputs, self.compute_dtype)
        x = self.source_embedding(inputs)  # [batch, src_len, hidden]
        x = self._add_timing_and_dropout(x, training)
        for layer in self.encoder_layers:
            if training and self.config.recompute_grad:
                x = recomputed(
                    layer, lambda x, layer=layer: layer(x, bias, training=True), x
                )
            else:
                x = layer(x, bias, training=training)
        return self.encoder_norm(x), bias

    def _decode(
        self, ids, start, encoder_output, self_bias, encdec_bias, training, caches
    ):
        """The decoder, cached or not: ids int [batch, new] at positions start.. ->
        (float32 logits [batch, new, vocab], per layer its cache including them)."""
        x = self.target_embedding(ids)  # [batch, new, hidden]
        x = self._add_timing_and_dropout(x, training, start_index=start)
        if training and self.config.recompute_grad and caches[0] is None:
            return self._decode_recomputed(x, encoder_output, self_bias, encdec_bias)
        new_caches = []
        for layer, cache in zip(self.decoder_layers, caches):
            x, cache = layer(
                x,
                encoder_output=encoder_output,
                self_bias=self_bias,
                encdec_bias=encdec_bias,
                training=training,
                cache=cache,
            )
            new_caches.append(cache)
        x = self.decoder_norm(x)  # [batch, new, hidden]
        logits = self.softmax(x, mode="linear")  # [batch, new, vocab]
        return tf.cast(logits, tf.float32), new_caches

    def _decode_recomputed(self, x, encoder_output, self_bias, encdec_bias):
        """The training decoder with each layer recomputed in the backward pass
        (models/recompute.py); x [batch, tgt_len, hidden] embedded and dropped out."""

        def layer_output(layer):
            def call(x, encoder_output):
                output, _ = layer(
                    x,
                    encoder_output=encoder_output,
                    self_bias=self_bias,
                    encdec_bias=encdec_bias,
                    training=True,
                )
                return output

            return call

        for layer in self.decoder_layers:
            x = recomputed(layer, layer_output(layer), x, encoder_output)
        x = self.decoder_norm(x)  # [batch, tgt_len, hidden]
        logits = self.softmax(x, mode="linear")  # [batch, tgt_len, vocab]
        return tf.cast(logits, tf.float32), [None] * len(self.decoder_layers)

    def decode(
        self, decoder_input_ids, encoder_output, encoder_decoder_bias, training=False
    ):
        """decoder_input_ids int [batch, tgt_len], ALREADY shifted right (see
        shift_right: position 0 holds 0) -> float32 logits [batch, tgt_len, vocab].
        Logits at position i predict target i from decoder inputs 0..i."""
        ids = tf.cast(decoder_input_ids, tf.int32)
        # [1, t, t]
        self_bias = attention_bias_lower_triangle(tf.shape(ids)[1], self.compute_dtype)
        no_cache = [None] * len(self.decoder_layers)
        logits, _ = self._decode(
            ids, 0, encoder_output, self_bias, encoder_decoder_bias, training, no_cache
        )
        return logits

    # --- incremental decoding (decoding/search.py drives these) ---------------------

    def encoder_decoder_cache(self, encoder_output):
        """Per decoder layer, the {"k", "v"} of the encoder output
        [batch, heads, src_len, depth]: computed once per sentence, not per step."""
        return [
            layer.encdec_attention.keys_values(encoder_output)
            for layer in self.decoder_layers
        ]

    def empty_self_cache(self, batch_size):
        """Per decoder layer, self-attention keys/values of no position yet: {"k", "v"}
        [batch, heads, 0, depth]; each decode_step appends one position."""
        heads = self.config.num_heads
        depth = self.config.hidden_size // heads
        empty = tf.zeros([batch_size, heads, 0, depth], self.compute_dtype)
        return [{"k": empty, "v": empty} for _ in self.decoder_layers]

    def decode_step(self, ids, index, self_cache, encdec_cache, encoder_decoder_bias):
        """`decode` for position `index` only, from cached keys/values.

        ids int [batch]: the decoder input at `index` (0 at index 0, then the previous
        output); self_cache from `empty_self_cache` or the previous step (holding
        positions 0..index-1); encdec_cache from `encoder_decoder_cache`. Gives the
        logits `decode` gives at `index` without recomputing positions < index.
        Returns (float32 logits [batch, vocab], self_cache grown by one position).
        """
        ids = tf.cast(ids, tf.int32)[:, None]  # [batch, 1]
        caches = [{"self": s, "encdec": e} for s, e in zip(self_cache, encdec_cache)]
        # The one new position sees every cached one and itself: no causal bias.
        logits, caches = self._decode(
            ids, index, None, 0.0, encoder_decoder_bias, False, caches
        )
        return logits[:, 0, :], [cache["self"] for cache in caches]

    def call(self, features, training=False):
        """features {"inputs": [batch, src_len], "targets": [batch, tgt_len]} int ids
        -> float32 logits [batch, tgt_len, vocab] (teacher forcing)."""
        encoder_output, bias = self.encode(features["inputs"], training=training)
        decoder_input_ids = shift_right(tf.cast(features["targets"], tf.int32))
        return self.decode(decoder_input_ids, encoder_output, bias, training=training)

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config)}
