"""Activation recomputation (hparam recompute_grad, models/recompute.py): the same
gradients as keeping the activations, dropout on, in float32 and mixed precision,
and the dropout generators left where the forward pass left them (so that a resumed
run draws the masks an uninterrupted one draws). The memory it saves is measured in
scripts/bench_memory.py, not asserted here."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_lite import hparams_sets
from t2t_lite.graph import graph_function
from t2t_lite.models.config import TransformerConfig
from t2t_lite.models.recompute import seed_generators
from t2t_lite.models.transformer import Transformer

VOCAB = 40


def model(recompute, dtype):
    keras.utils.set_random_seed(7)  # the same weights and generator seeds each time
    config = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        filter_size=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        layer_prepostprocess_dropout=0.3,
        attention_dropout=0.3,
        relu_dropout=0.3,
        shared_embedding_and_softmax_weights=False,  # dense and sparse gradients
        activation_dtype=dtype,
        recompute_grad=recompute,
    )
    return Transformer(config)


def batch():
    rng = np.random.RandomState(0)
    inputs = rng.randint(2, VOCAB, (3, 7))
    inputs[0, 5:] = 0  # padding
    return {
        "inputs": tf.constant(inputs, tf.int32),
        "targets": tf.constant(rng.randint(2, VOCAB, (3, 5)), tf.int32),
    }


def two_steps(recompute, dtype):
    """Gradients of two consecutive training calls (the second sees the generators
    as the first left them), the losses, and the generators' final states."""
    net = model(recompute, dtype)
    features = batch()
    net(features)

    @graph_function
    def gradients(features):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(net(features, training=True)))
        return tape.gradient(loss, net.trainable_variables), loss

    results = []
    for _ in range(2):
        grads, loss = gradients(features)
        grads = [tf.convert_to_tensor(g).numpy() for g in grads]
        results.append((grads, float(loss)))
    states = [v.numpy() for v in net.non_trainable_variables]
    return results, states


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_recomputed_gradients_equal_kept_ones_with_dropout(dtype):
    kept, kept_states = two_steps(False, dtype)
    again, again_states = two_steps(True, dtype)
    for (kept_grads, kept_loss), (grads, loss) in zip(kept, again):
        assert loss == kept_loss  # the same forward pass, masks included
        for expected, actual in zip(kept_grads, grads):
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-7)
    # The two calls drew different masks (the control that dropout is on)...
    assert kept[0][1] != kept[1][1]
    # ...and the generators advanced once per draw, not twice.
    assert len(kept_states) == len(again_states) > 0
    for expected, actual in zip(kept_states, again_states):
        np.testing.assert_array_equal(actual, expected)


def test_every_layer_generator_is_rewound():
    layer = model(True, "float32").decoder_layers[0]
    # The layer's own, its feed-forward's and its two attentions' generators.
    assert len(seed_generators(layer)) == 4


def test_recompute_grad_hparam_reaches_the_model():
    hp = hparams_sets.transformer_tiny()
    assert hp.recompute_grad is False
    hp.parse("recompute_grad=true")
    assert Transformer.from_hparams(hp, vocab_size=VOCAB).config.recompute_grad
