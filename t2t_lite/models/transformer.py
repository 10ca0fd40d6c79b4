"""T2T's Transformer encoder-decoder as Keras 3 layers on TensorFlow ops.

Only `Transformer.from_hparams` reads hparams; it builds the one `TransformerConfig`
every layer takes. Ids: 0 is padding, 1 is EOS. Padding never leaks: a sequence gives
the same outputs alone or batched with longer ones.
"""

import dataclasses

import keras
import tensorflow as tf

from t2t_lite.hparams_checks import check_transformer_hparams
from t2t_lite.models.attention import (
    attention_bias_ignore_padding,
    attention_bias_lower_triangle,
)
from t2t_lite.models.config import TransformerConfig, as_config
from t2t_lite.models.kernels import dropout
from t2t_lite.models.layers import (
    DecoderLayer,
    EmbeddingSharedWeights,
    EncoderLayer,
    build_sublayers,
    get_timing_signal_1d,
    layer_norm,
    shift_right,
)
from t2t_lite.models.recompute import recomputed


class Transformer(keras.Model):
    """T2T Transformer: features {"inputs", "targets"} (int ids) -> logits.

    call() returns float32 logits [batch, tgt_len, vocab]. `encode`, `decode` and the
    cached `decode_step` are public so decoding (greedy, beam search) can reuse them.
    """

    def __init__(self, config, **kwargs):
        """config: a TransformerConfig (or its `dataclasses.asdict`)."""
        config = as_config(config)
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
        self.encoder_norm = layer_norm(config, "encoder_norm")
        self.decoder_norm = layer_norm(config, "decoder_norm")

    def build(self, input_shape=None):
        """Every variable created from the config alone. Keras would otherwise build
        the model by tracing call() in a scratch graph, and each sublayer again by
        tracing its own: most of what building a model cost (docs/benchmarks.md,
        "Building a model")."""
        embeddings = (self.source_embedding, self.target_embedding, self.softmax)
        build_sublayers(dict.fromkeys(embeddings), None)  # shared: one layer
        build_sublayers(
            [
                *self.encoder_layers,
                *self.decoder_layers,
                self.encoder_norm,
                self.decoder_norm,
            ],
            (None, None, self.config.hidden_size),
        )

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
