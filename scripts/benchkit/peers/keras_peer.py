"""The Keras 3 + keras-hub peer of bench_peers.py and bench_fit.py: what a Keras user
writes for the same encoder-decoder (keras-hub layers, model.fit, Adam's own gradient
accumulation), trained on t2t_lite's batches."""

import time

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from benchkit import builds
from benchkit.peers.corpus import target_tokens
from t2t_lite.optim.batch_plan import plan_from_hparams
from t2t_lite.optim.schedule import schedule_from_hparams


def keras_transformer(spec):
    """The encoder-decoder a Keras user assembles from keras-hub layers: shared token
    + learned position embedding, pre-norm layers, final norms, tied softmax."""
    d, dropout = spec["hidden_size"], spec["dropout"]
    layer_args = {
        "intermediate_dim": spec["filter_size"],
        "num_heads": spec["num_heads"],
        "dropout": dropout,
        "normalize_first": True,  # pre-norm, as t2t_lite and OpenNMT-tf
        "layer_norm_epsilon": 1e-6,
    }
    embed = keras_hub.layers.TokenAndPositionEmbedding(
        spec["vocab_size"], spec["max_tokens"] + 1, d, tie_weights=True
    )
    source = keras.Input((None,), dtype="int32", name="source")
    target_in = keras.Input((None,), dtype="int32", name="target_in")
    source_mask = keras.ops.not_equal(source, 0)
    x = keras.layers.Dropout(dropout)(embed(source))  # [batch, source_len, hidden]
    for _ in range(spec["num_layers"]):
        x = keras_hub.layers.TransformerEncoder(**layer_args)(
            x, padding_mask=source_mask
        )
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x)
    y = keras.layers.Dropout(dropout)(embed(target_in))  # [batch, target_len, hidden]
    for _ in range(spec["num_layers"]):
        y = keras_hub.layers.TransformerDecoder(**layer_args)(
            y,
            x,
            decoder_padding_mask=keras.ops.not_equal(target_in, 0),
            encoder_padding_mask=source_mask,
        )
    y = keras.layers.LayerNormalization(epsilon=1e-6)(y)
    logits = embed.token_embedding(y, reverse=True)  # [batch, target_len, vocab]
    return keras.Model([source, target_in], logits)


def keras_examples(batches):
    """((source, decoder input), labels, weights) numpy tuples from t2t_lite batches:
    the decoder input is the target shifted right after a start id 1 (so it is
    non-zero exactly where the labels are), weights mask the padding."""
    examples = []
    for b in batches:
        targets = b["targets"]
        target_in = np.concatenate([np.ones_like(targets[:, :1]), targets[:, :-1]], 1)
        target_in[targets == 0] = 0
        weights = (targets != 0).astype(np.float32)
        examples.append(((b["inputs"], target_in), targets, weights))
    return examples


class KerasSession:
    """A keras-hub Transformer trained with model.fit, as a Keras user would."""

    def __init__(self, name, spec, batches):
        if name == "keras_bf16":
            keras.mixed_precision.set_global_policy("mixed_bfloat16")
        keras.utils.set_random_seed(spec["seed"])
        self.model = keras_transformer(spec)
        hp = builds.hparams("transformer_base", "", hidden_size=spec["hidden_size"])
        optimizer = keras.optimizers.Adam(  # same Adam values and schedule as t2t_lite
            learning_rate=schedule_from_hparams(hp, 100000, plan_from_hparams(hp)),
            beta_1=0.9,
            beta_2=0.997,
            epsilon=1e-9,
            gradient_accumulation_steps=spec["accumulate_steps"],
        )
        vocab, smoothing = spec["vocab_size"], spec["label_smoothing"]

        def loss(labels, logits):
            labels = keras.ops.one_hot(keras.ops.cast(labels, "int32"), vocab)
            return keras.losses.categorical_crossentropy(
                labels, logits, from_logits=True, label_smoothing=smoothing
            )

        self.model.compile(optimizer=optimizer, loss=loss)  # jit_compile="auto"
        examples = keras_examples(batches)

        def spec_of(array):
            return tf.TensorSpec([None, None], tf.as_dtype(array.dtype))

        self.data = tf.data.Dataset.from_generator(
            lambda: iter(examples),
            output_signature=tf.nest.map_structure(spec_of, examples[0]),
        ).prefetch(2)
        self.steps, self.tokens = len(examples), [target_tokens([b]) for b in batches]
        self.n = spec["accumulate_steps"]
        self.params = int(self.model.count_params())
        self.warmup_batches = spec["accumulate_steps"]  # traces fit's step once

    def segment(self, count=None):
        """One model.fit epoch over the first `count` batches (default all), timed
        from the first batch's start to the last one's end (not fit's own setup)."""
        times = []

        def begin(batch, logs):
            if batch == 0:
                times.append(time.perf_counter())

        def end(batch, logs):
            times.append(time.perf_counter())

        timer = keras.callbacks.LambdaCallback(
            on_train_batch_begin=begin, on_train_batch_end=end
        )
        self.model.fit(
            self.data,
            epochs=1,
            steps_per_epoch=count or self.steps,
            verbose=0,
            callbacks=[timer],
        )
        seconds = times[-1] - times[0]
        tokens = self.tokens[:count]
        updates = len(tokens) // self.n
        return {"tokens": sum(tokens), "seconds": seconds, "updates": updates}
