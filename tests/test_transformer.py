"""Tests for t2t_lite.models.transformer (tiny sizes, CPU, fast)."""

import math
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.models import (
    Transformer,
    attention,
    kernels,
    layers,
    token_accuracy,
    token_loss,
)
from t2t_lite.models.config import TransformerConfig

VOCAB = 20
HIDDEN = 16


def _hparams(**overrides):
    values = {
        "hidden_size": HIDDEN,
        "filter_size": 32,
        "num_hidden_layers": 2,
        "num_encoder_layers": 0,
        "num_decoder_layers": 0,
        "num_heads": 2,
        "layer_prepostprocess_dropout": 0.0,
        "attention_dropout": 0.0,
        "relu_dropout": 0.0,
        "shared_embedding_and_softmax_weights": True,
        "norm_epsilon": 1e-6,
        "initializer_gain": 1.0,
        "activation_dtype": "float32",
        "recompute_grad": False,
    }
    values.update(overrides)
    return types.SimpleNamespace(**values)


def _model(seed=0, **overrides):
    keras.utils.set_random_seed(seed)
    return Transformer.from_hparams(_hparams(**overrides), vocab_size=VOCAB)


def _config(**overrides):
    """A one-layer TransformerConfig without dropout, for layer-level tests."""
    values = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "filter_size": 32,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "num_heads": 2,
        "layer_prepostprocess_dropout": 0.0,
        "attention_dropout": 0.0,
        "relu_dropout": 0.0,
        "shared_embedding_and_softmax_weights": True,
    }
    return TransformerConfig(**{**values, **overrides})


def _features(inputs, targets):
    return {
        "inputs": tf.constant(inputs, tf.int32),
        "targets": tf.constant(targets, tf.int32),
    }


FEATURES = _features(
    [[5, 6, 7, 1, 0], [8, 9, 1, 0, 0]], [[4, 3, 1, 0], [10, 11, 12, 1]]
)


def test_output_shape_and_dtype():
    model = _model(num_encoder_layers=1)
    logits = model(FEATURES)
    assert logits.shape == (2, 4, VOCAB)
    assert logits.dtype == tf.float32
    assert np.all(np.isfinite(logits.numpy()))
    # num_encoder_layers=1 is used; num_decoder_layers=0 means num_hidden_layers.
    assert len(model.encoder_layers) == 1
    assert len(model.decoder_layers) == 2


def test_layer_get_config_round_trip():
    config = _config(
        layer_prepostprocess_dropout=0.1,
        attention_dropout=0.2,
        relu_dropout=0.3,
        norm_epsilon=1e-5,
        initializer_gain=0.5,
    )
    layer = layers.DecoderLayer(config, name="dec")
    layer_config = layer.get_config()
    clone = layers.DecoderLayer.from_config(layer_config)
    assert clone.get_config() == layer_config and clone.config == config
    assert layer_config["config"]["relu_dropout"] == 0.3
    model = _model(shared_embedding_and_softmax_weights=False)
    clone_model = Transformer.from_config(model.get_config())
    assert clone_model.get_config() == model.get_config()
    assert clone_model.config.shared_embedding_and_softmax_weights is False
    assert clone_model.config == model.config and clone_model.vocab_size == VOCAB


def test_padding_does_not_leak():
    model = _model(seed=1, shared_embedding_and_softmax_weights=False)
    short = _features([[5, 6, 1]], [[7, 1]])
    batched = _features(
        [[5, 6, 1, 0, 0, 0], [9, 8, 7, 6, 5, 1]], [[7, 1, 0, 0, 0], [3, 4, 5, 6, 1]]
    )
    alone = model(short).numpy()[0]  # [2, vocab]
    together = model(batched).numpy()[0, :2]  # [2, vocab]
    np.testing.assert_allclose(alone, together, atol=1e-5, rtol=0)


def test_dropout_is_noop_when_not_training_or_rate_zero():
    model = _model(
        layer_prepostprocess_dropout=0.5, attention_dropout=0.5, relu_dropout=0.5
    )
    eval_1 = model(FEATURES, training=False).numpy()
    eval_2 = model(FEATURES, training=False).numpy()
    train = model(FEATURES, training=True).numpy()
    np.testing.assert_array_equal(eval_1, eval_2)
    assert np.max(np.abs(train - eval_1)) > 1e-3  # dropout really acts in training.
    no_dropout = _model()
    np.testing.assert_array_equal(
        no_dropout(FEATURES, training=True).numpy(),
        no_dropout(FEATURES, training=False).numpy(),
    )


def test_decoder_is_causal():
    model = _model(seed=2)
    before = model(_features([[5, 6, 1]], [[7, 8, 9, 1]])).numpy()
    after = model(_features([[5, 6, 1]], [[7, 8, 13, 1]])).numpy()
    # Target 2 changed: logits 0..2 (which see targets < 2) stay, logit 3 changes.
    np.testing.assert_allclose(before[0, :3], after[0, :3], atol=1e-6, rtol=0)
    assert np.max(np.abs(before[0, 3] - after[0, 3])) > 1e-4


def _variables(model):
    """(path inside the model, shape, dtype, value) of each variable in order."""
    return [
        (w.path.split("/", 1)[1], tuple(w.shape), w.dtype, w.numpy())
        for w in model.weights
    ]


@pytest.mark.parametrize("shared", [True, False])
def test_a_model_builds_from_its_config_with_the_variables_a_call_creates(
    monkeypatch, shared
):
    """build() alone builds every layer, from the config: Keras would otherwise
    build each layer without a build() of its own by tracing its call() in a
    scratch graph. It creates the variables a first call creates layer by layer:
    the same paths (checkpoint keys), shapes, dtypes, order and seeded values."""
    from t2t_lite.models import transformer

    built = _model(seed=5, shared_embedding_and_softmax_weights=shared)
    built.build()
    assert all(layer.built for layer in built._flatten_layers())
    with monkeypatch.context() as patch:
        for module in (layers, transformer):  # every build() then builds nothing
            patch.setattr(module, "build_sublayers", lambda *args: None)
        called = _model(seed=5, shared_embedding_and_softmax_weights=shared)
        called(FEATURES)
    expected = _variables(called)
    assert len(expected) > 60
    for got, want in zip(_variables(built), expected, strict=True):
        assert got[:3] == want[:3]
        np.testing.assert_array_equal(got[3], want[3], err_msg=want[0])


def test_encode_decode_match_call():
    model = _model(seed=3)
    encoder_output, bias = model.encode(FEATURES["inputs"])
    assert encoder_output.shape == (2, 5, HIDDEN) and bias.shape == (2, 1, 1, 5)
    logits = model.decode(layers.shift_right(FEATURES["targets"]), encoder_output, bias)
    np.testing.assert_array_equal(logits.numpy(), model(FEATURES).numpy())
    np.testing.assert_array_equal(
        layers.shift_right(tf.constant([[4, 3, 1]])).numpy(), [[0, 4, 3]]
    )


def test_source_embedding_gradient_is_indexed_slices():
    model = _model(shared_embedding_and_softmax_weights=False)
    model(FEATURES)
    weight = model.source_embedding.weights_matrix
    with tf.GradientTape() as tape:
        loss, _ = token_loss(model(FEATURES, training=True), FEATURES["targets"], 0.1)
    grad = tape.gradient(loss, weight)
    assert isinstance(grad, tf.IndexedSlices)
    assert grad.dense_shape.numpy().tolist() == [VOCAB, HIDDEN]


@pytest.mark.parametrize("shared, expected", [(True, 1), (False, 3)])
def test_embedding_and_softmax_sharing(shared, expected):
    model = _model(shared_embedding_and_softmax_weights=shared)
    model(FEATURES)
    matrices = [
        v for v in model.trainable_variables if tuple(v.shape) == (VOCAB, HIDDEN)
    ]
    assert len(matrices) == expected
    assert (model.source_embedding is model.softmax) == shared
    stddev = np.std(matrices[0].numpy())
    assert 0.5 * HIDDEN**-0.5 < stddev < 1.5 * HIDDEN**-0.5


def test_embedding_scales_and_zeroes_padding():
    layer = layers.EmbeddingSharedWeights(VOCAB, HIDDEN)
    out = layer(tf.constant([[3, 0]])).numpy()  # [1, 2, hidden]
    weights = layer.weights_matrix.numpy()
    np.testing.assert_allclose(out[0, 0], weights[3] * math.sqrt(HIDDEN), rtol=1e-6)
    np.testing.assert_array_equal(out[0, 1], np.zeros(HIDDEN))


def test_timing_signal_matches_formula():
    signal = layers.get_timing_signal_1d(3, 6).numpy()[0]  # [3, 6]
    inv = np.exp(-np.arange(3) * math.log(1e4) / 2)
    expected = np.concatenate(
        [np.sin(np.outer(np.arange(3), inv)), np.cos(np.outer(np.arange(3), inv))],
        axis=1,
    )
    np.testing.assert_allclose(signal, expected, atol=1e-6)


def test_token_loss_ignores_padding():
    targets = tf.constant([[3, 4, 1, 0, 0], [5, 1, 0, 0, 0]])
    logits = tf.random.stateless_normal([2, 5, VOCAB], seed=[1, 2])
    loss, count = token_loss(logits, targets, 0.1)
    assert count.dtype == tf.float32 and float(count) == 5.0
    garbage = tf.where(targets[:, :, None] == 0, 1e3, logits)  # change pad logits
    loss_2, _ = token_loss(garbage, targets, 0.1)
    np.testing.assert_allclose(float(loss), float(loss_2), rtol=1e-6)


def test_token_loss_best_prediction_is_zero_with_label_smoothing():
    smoothing = 0.1
    targets = tf.constant([[3, 7, 1, 0]])
    soft = tf.one_hot(targets, VOCAB, 1.0 - smoothing, smoothing / (VOCAB - 1))
    loss, count = token_loss(tf.math.log(soft), targets, smoothing)
    assert float(count) == 3.0
    assert abs(float(loss)) < 1e-5
    # A one-hot-confident prediction is worse than the smoothed distribution.
    confident, _ = token_loss(10.0 * tf.one_hot(targets, VOCAB), targets, smoothing)
    assert float(confident) > 1.0


def test_token_loss_hand_computed():
    logits = np.array([[[2.0, 0.0, 1.0], [0.0, 0.5, 0.0]]], np.float32)
    targets = np.array([[2, 0]], np.int32)  # second position is padding
    log_probs = logits[0, 0] - np.log(np.sum(np.exp(logits[0, 0])))
    # No smoothing: plain negative log likelihood.
    loss, count = token_loss(logits, targets, 0.0)
    np.testing.assert_allclose(float(loss), -log_probs[2], rtol=1e-6)
    assert float(count) == 1.0
    # Smoothing 0.2 over vocab 3: soft targets [0.1, 0.1, 0.8], minus their entropy.
    soft = np.array([0.1, 0.1, 0.8])
    expected = -np.sum(soft * log_probs) + np.sum(soft * np.log(soft))
    loss, _ = token_loss(logits, targets, 0.2)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


@pytest.mark.parametrize("self_attention", [True, False])
def test_attention_equals_a_numpy_reference(self_attention):
    """The fused q/k/v projection (one matmul of the three kernels side by side)
    computes T2T's attention with each kernel in its own role."""
    layer = attention.MultiHeadAttention(_config())
    rng = np.random.default_rng(0)
    query = tf.constant(rng.normal(size=[2, 3, HIDDEN]), tf.float32)
    memory = query if self_attention else tf.constant(rng.normal(size=[2, 5, HIDDEN]))
    memory = tf.cast(memory, tf.float32)
    bias = np.zeros([2, 1, 1, memory.shape[1]], np.float32)
    bias[1, 0, 0, -1] = -1e9  # the second sequence's last memory position is padding
    out, _ = layer(query, memory, tf.constant(bias))

    def heads(x, dense):  # [batch, len, hidden] -> [batch, heads, len, depth]
        y = x.numpy() @ dense.kernel.numpy()
        return y.reshape(y.shape[0], y.shape[1], 2, HIDDEN // 2).transpose(0, 2, 1, 3)

    q = heads(query, layer.q_dense) * (HIDDEN // 2) ** -0.5
    k, v = heads(memory, layer.k_dense), heads(memory, layer.v_dense)
    logits = q @ k.transpose(0, 1, 3, 2) + bias
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    combined = (weights @ v).transpose(0, 2, 1, 3).reshape(2, 3, HIDDEN)
    expected = combined @ layer.output_dense.kernel.numpy()
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_loss_gradient_equals_one_hot_cross_entropy(smoothing):
    """The fused loss's hand-written gradient equals autodiff of T2T's
    formulation (explicit smoothed one-hot targets), padding and an upstream
    factor included."""
    vocab = 50
    logits = 3.0 * tf.random.stateless_normal([3, 7, vocab], seed=[1, 2])
    targets = tf.constant(np.random.default_rng(0).integers(0, vocab, [3, 7]))
    low = smoothing / (vocab - 1)
    soft = tf.one_hot(targets, vocab, 1.0 - smoothing, low)
    entropy = -np.sum(
        [p * np.log(p) for p in [1.0 - smoothing] + [low] * (vocab - 1) if p > 0]
    )
    weights = tf.cast(targets > 0, tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        loss, _ = token_loss(logits, targets, smoothing)
        reference = tf.reduce_sum(
            (tf.nn.softmax_cross_entropy_with_logits(soft, logits) - entropy) * weights
        )
        loss, reference = 1.7 * loss, 1.7 * reference
    np.testing.assert_allclose(float(loss), float(reference), rtol=1e-5)
    np.testing.assert_allclose(
        tape.gradient(loss, logits).numpy(),
        tape.gradient(reference, logits).numpy(),
        atol=1e-6,
    )
    assert np.abs(tape.gradient(loss, logits).numpy()).max() > 0.1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_mask_rate_scale_and_gradient(dtype):
    """16-bit masks: the drop fraction is the rate, kept values are scaled by the
    exact inverse keep probability, the gradient uses the same mask and scale,
    and odd sizes work (two elements per 32-bit draw)."""
    x = tf.ones([101, 301], dtype)
    generator = keras.random.SeedGenerator(3)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = kernels.dropout(x, 0.1, True, generator)
        total = tf.reduce_sum(tf.cast(y, tf.float32) * 2.0)
    y = tf.cast(y, tf.float32).numpy()
    grad = tf.cast(tape.gradient(total, x), tf.float32).numpy()
    dropped = y == 0
    assert abs(dropped.mean() - 0.1) < 0.005  # 30401 draws: 5 sigma is 0.0086
    kept_scale = 1.0 / (1.0 - 6554 / 65536)  # round(0.1·2¹⁶) = 6554
    tolerance = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(np.unique(y[~dropped]), [kept_scale], rtol=tolerance)
    np.testing.assert_array_equal(grad == 0, dropped)
    np.testing.assert_allclose(grad[~dropped], 2.0 * kept_scale, rtol=tolerance)
    again = kernels.dropout(tf.ones([101, 301], dtype), 0.1, True, generator)
    assert not np.array_equal(tf.cast(again, tf.float32).numpy() == 0, dropped)


def test_token_accuracy_hand_made():
    targets = tf.constant([[2, 3, 1, 0], [4, 1, 0, 0], [2, 2, 2, 1], [0, 0, 0, 0]])
    predictions = tf.constant([[2, 3, 1, 9], [4, 2, 7, 7], [2, 2, 2, 1], [5, 5, 5, 5]])
    logits = tf.one_hot(predictions, 10)
    correct, tokens, correct_seqs, seqs = token_accuracy(logits, targets)
    # Row 0: 3/3 (pad ignored); row 1: 1/2; row 2: 4/4; row 3: only padding.
    assert (float(correct), float(tokens)) == (8.0, 9.0)
    assert (float(correct_seqs), float(seqs)) == (2.0, 3.0)
    assert correct.dtype == tf.float32 and seqs.dtype == tf.float32


def test_config_rejects_heads_not_dividing_hidden():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        _model(num_heads=3)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_layer_norm_equals_keras_layer_norm_and_its_gradient(dtype):
    """The hand-written gradient against autodiff of Keras's own layer: output and
    the gradients of x, gamma and beta, on rows of very different scales, with the
    same weight names (checkpoint keys)."""
    rng = np.random.default_rng(0)
    x = tf.constant(
        rng.normal(size=[3, 5, 16]) * rng.uniform(0.01, 100, size=[3, 5, 1]) + 2,
        tf.float32,
    )
    upstream = tf.constant(rng.normal(size=[3, 5, 16]), tf.float32)
    ours = kernels.LayerNormalization(epsilon=1e-6, dtype=dtype, name="norm")
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype, name="norm")
    ours.build(x.shape)
    keras_norm.build(x.shape)
    ours.gamma.assign(rng.normal(size=[16]).astype(np.float32) + 1)
    ours.beta.assign(rng.normal(size=[16]).astype(np.float32))
    keras_norm.set_weights(ours.get_weights())
    results = []
    for layer in (ours, keras_norm):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = tf.cast(layer(x), tf.float32)
            loss = tf.reduce_sum(out * upstream)
        results.append([out, *tape.gradient(loss, [x, layer.gamma, layer.beta])])
    assert [w.name for w in ours.weights] == [w.name for w in keras_norm.weights]
    assert ours.compute_dtype == keras_norm.compute_dtype
    out_tolerance = 1e-5 if dtype == "float32" else 1e-2  # one bfloat16 ulp at ~4
    np.testing.assert_allclose(results[0][0], results[1][0], atol=out_tolerance)
    for ours_grad, keras_grad in zip(results[0][1:], results[1][1:]):
        scale = float(tf.reduce_max(tf.abs(keras_grad)))
        np.testing.assert_allclose(ours_grad, keras_grad, atol=2e-5 * scale)
