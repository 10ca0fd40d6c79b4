"""Shared builders for the accumulation tests: tiny models, uneven micro-batches."""

import functools

import keras
import numpy as np
import tensorflow as tf

import t2t_lite  # noqa: F401  (registers everything)
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.training.opening.build import build_training

VOCAB = 12


def tiny_hparams(**overrides):
    """transformer_test without dropout, with a schedule that depends on train_steps."""
    hp = transformer_test().override(
        layer_prepostprocess_dropout=0.0,
        attention_dropout=0.0,
        relu_dropout=0.0,
        learning_rate_schedule="constant*linear_warmup*linear_decay",
        learning_rate_constant=0.01,
        learning_rate_warmup_steps=2,
        learning_rate_decay_steps=4,
        shared_embedding_and_softmax_weights=False,
    )
    return hp.override(**overrides)


def random_batch(rng, batch, src_len, tgt_len):
    """Ids in [2, VOCAB) with random lengths ≤ the given ones, EOS-terminated, 0-padded."""

    def side(length):
        ids = np.zeros([batch, length], np.int32)
        for row in range(batch):
            n = rng.integers(1, length + 1)
            ids[row, : n - 1] = rng.integers(2, VOCAB, n - 1)
            ids[row, n - 1] = 1
        return ids

    return {"inputs": side(src_len), "targets": side(tgt_len)}


def uneven_micro_batches(count, seed=0):
    """`count` micro-batches whose shapes and non-pad token counts all differ."""
    rng = np.random.default_rng(seed)
    return [random_batch(rng, 2 + i % 3, 3 + 2 * i, 2 + 3 * i) for i in range(count)]


def concatenate(batches):
    """One batch holding all rows of `batches`, padded to the longest."""
    out = {}
    for key in ("inputs", "targets"):
        length = max(b[key].shape[1] for b in batches)
        out[key] = np.concatenate(
            [np.pad(b[key], [[0, 0], [0, length - b[key].shape[1]]]) for b in batches]
        )
    return out


def build(hp, train_steps, initial_weights=None, strategy=None):
    """(model, TrainStep) for hp, through the trainer's own `build_training`; weights
    copied from initial_weights if given."""
    run = build_training(
        hp,
        vocab_size=VOCAB,
        train_steps=train_steps,
        initial_weights=initial_weights,
        strategy=strategy,
    )
    return run.model, run.step


@functools.cache
def seeded_weights(seed):
    """The tiny model's initial weights drawn from `seed`, built once per seed
    (callers only read them). Unseeded, a build draws from the process's generator,
    so a test's start, and with it whether float32 rounding near a ReLU's kink
    leaves a tolerance, would depend on the tests that ran before it."""
    keras.utils.set_random_seed(seed)
    return tuple(build(tiny_hparams(), train_steps=1)[0].get_weights())


def run(step, batches, start=0):
    """Feeds batches as micro-steps start, start+1, ... and returns the step."""
    for i, batch in enumerate(batches):
        features = {k: tf.constant(v) for k, v in batch.items()}
        step.train_on(features, step.is_update_micro_step(start + i))
    return step


def tolerance_ratio(a, b, rtol=1e-5, atol=1e-7):
    """max |a-b| / (rtol·|b| + atol) over all weights; < 1 means "equal". `a` and
    `b` are models or lists of weight arrays (model.get_weights()).

    rtol is 1e-5, the equivalence tolerance; atol is about one float32 ulp at
    magnitude 1, so weights that sit near zero are not judged by a relative error of
    pure rounding noise.
    """
    worst = 0.0
    for x, y in zip(_weights(a), _weights(b), strict=True):
        worst = max(worst, float(np.max(np.abs(x - y) / (rtol * np.abs(y) + atol))))
    return worst


def _weights(model_or_weights):
    if hasattr(model_or_weights, "get_weights"):
        return model_or_weights.get_weights()
    return list(model_or_weights)
