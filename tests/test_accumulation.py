"""The key tests: n accumulated micro-batches == one concatenated batch (docs/design.md §2).

Micro-batches hold different numbers of target tokens, dropout is off, and the
schedule includes linear_decay against train_steps, so the tests also pin down that
the learning rate is evaluated in updates with train_steps / n.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
from support.accumulation_helpers import (
    VOCAB,
    build,
    concatenate,
    run,
    seeded_weights,
    tiny_hparams,
    tolerance_ratio,
    uneven_micro_batches,
)

from t2t_lite.models.losses import token_loss

UPDATES = 3
SEED = 20261129  # of the initial weights (seeded_weights)


@functools.cache
def _train_accumulated(n, **overrides):
    """Weights after UPDATES updates of n micro-batches each, from
    seeded_weights(SEED). Cached: a configuration several tests compare against
    trains once."""
    hp = tiny_hparams(optimizer_multistep_accumulate_steps=n, **overrides)
    model, step = build(
        hp, train_steps=n * UPDATES, initial_weights=seeded_weights(SEED)
    )
    run(step, uneven_micro_batches(n * UPDATES))
    assert step.update_step == UPDATES
    assert step.micro_step == n * UPDATES
    return tuple(model.get_weights())


@functools.cache
def _train_big_batch(n, **overrides):
    """One update per concatenation of the same n micro-batches, n=1 (cached, as
    _train_accumulated)."""
    micro = uneven_micro_batches(n * UPDATES)
    hp = tiny_hparams(optimizer_multistep_accumulate_steps=1, **overrides)
    model, step = build(hp, train_steps=UPDATES, initial_weights=seeded_weights(SEED))
    run(step, [concatenate(micro[u * n : (u + 1) * n]) for u in range(UPDATES)])
    assert step.update_step == UPDATES
    return tuple(model.get_weights())


def _train_mean_of_means(n, optimizer):
    """What T2T, Keras 3 and older HF do: average the micro-batches' mean losses."""
    hp = tiny_hparams(optimizer=optimizer)
    model, step = build(hp, train_steps=UPDATES, initial_weights=seeded_weights(SEED))
    micro = uneven_micro_batches(n * UPDATES)
    variables = model.trainable_variables
    for u in range(UPDATES):
        total = [tf.zeros_like(v) for v in variables]
        for batch in micro[u * n : (u + 1) * n]:
            batch = {k: tf.constant(v) for k, v in batch.items()}
            with tf.GradientTape() as tape:
                loss_sum, tokens = token_loss(
                    model(batch, training=True), batch["targets"], hp.label_smoothing
                )
                mean_loss = loss_sum / tokens
            grads = tape.gradient(mean_loss, variables)
            total = [t + tf.convert_to_tensor(g) / n for t, g in zip(total, grads)]
        step.optimizer.apply(total, variables)
    return model


def _as_model(weights):
    model, _ = build(tiny_hparams(), UPDATES, initial_weights=list(weights))
    return model


@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.slow
def test_accumulation_equals_big_batch(n, optimizer):
    accumulated = _train_accumulated(n, optimizer=optimizer)
    big = _train_big_batch(n, optimizer=optimizer)
    assert tolerance_ratio(accumulated, seeded_weights(SEED)) > 100  # it did train
    assert tolerance_ratio(accumulated, big) < 1


@pytest.mark.parametrize("optimizer", ["sgd", "multistep_adam", "adafactor"])
@pytest.mark.slow
def test_every_registered_optimizer_accumulates_exactly(optimizer):
    accumulated = _train_accumulated(2, optimizer=optimizer)
    big = _train_big_batch(2, optimizer=optimizer)
    assert tolerance_ratio(accumulated, seeded_weights(SEED)) > 100  # it did train
    assert tolerance_ratio(accumulated, big) < 1


@pytest.mark.parametrize(
    "knob", [{"clip_grad_norm": 0.05}, {"weight_decay": 0.5}], ids=["clip", "decay"]
)
@pytest.mark.slow
def test_clipping_and_weight_decay_act_once_per_update(knob):
    """Momentum SGD (unlike Adam) feels the gradient's scale, so each knob shows."""
    accumulated = _train_accumulated(4, optimizer="momentum", **knob)
    big = _train_big_batch(4, optimizer="momentum", **knob)
    assert tolerance_ratio(accumulated, big) < 1
    without = _train_big_batch(4, optimizer="momentum")
    assert tolerance_ratio(without, big) > 10  # the knob really changed the update


@pytest.mark.slow
def test_clipping_and_weight_decay_together_with_adam():
    overrides = {
        "optimizer": "multistep_adam",
        "clip_grad_norm": 0.05,
        "weight_decay": 0.1,
    }
    accumulated = _train_accumulated(4, **overrides)
    big = _train_big_batch(4, **overrides)
    assert tolerance_ratio(accumulated, big) < 1


def test_micro_steps_scatter_sparse_embedding_gradients():
    """docs/design.md §2.4: the unshared embeddings' IndexedSlices are scatter-added into the
    accumulators on micro-steps, not turned into dense vocab×hidden tensors."""
    hp = tiny_hparams(optimizer_multistep_accumulate_steps=2)
    _, step = build(hp, 2)
    graph = step.accumulate.get_concrete_function().graph
    op_types = [op.type for op in graph.get_operations()]
    assert op_types.count("ResourceScatterAdd") == 2  # source and target embedding
    # What densifying the slices compiles to: a [vocab, hidden] UnsortedSegmentSum.
    # (The loss's target-logit gather has a rank-1 one, which is no embedding; the
    # noise scale sums each micro-batch's slices per distinct row, [rows, hidden].)
    sums = [op for op in graph.get_operations() if op.type == "UnsortedSegmentSum"]
    densified = [op for op in sums if op.outputs[0].shape[:1] == [VOCAB]]
    assert not densified, [op.name for op in densified]
    per_row = [op for op in sums if op.outputs[0].shape.rank == 2]
    assert len(per_row) == 2 and step.noise_scale is not None


def test_clipping_threshold_is_below_the_gradient_norm():
    """Guards the test above: 0.05 must actually clip these gradients."""
    hp = tiny_hparams()
    model = _as_model(seeded_weights(SEED))
    batch = {k: tf.constant(v) for k, v in concatenate(uneven_micro_batches(4)).items()}
    with tf.GradientTape() as tape:
        loss_sum, tokens = token_loss(
            model(batch), batch["targets"], hp.label_smoothing
        )
        mean_loss = loss_sum / tokens
    grads = tape.gradient(mean_loss, model.trainable_variables)
    assert float(tf.linalg.global_norm(grads)) > 0.05


@pytest.mark.slow
def test_mean_of_micro_batch_means_misses_the_tolerance():
    """The equivalence check can catch the normalization bug peers have."""
    n = 4
    big = _train_big_batch(n, optimizer="adam")
    assert tolerance_ratio(_train_accumulated(n, optimizer="adam"), big) < 1
    assert tolerance_ratio(_train_mean_of_means(n, "adam"), big) > 10


def test_micro_batches_really_hold_different_token_counts():
    counts = {int(np.count_nonzero(b["targets"])) for b in uneven_micro_batches(4)}
    assert len(counts) == 4


def test_weight_decay_skips_only_biases_as_t2t_does():
    """T2T decays every variable but rank-1 ones named like a bias: layer-norm
    scales are decayed, Dense biases and layer-norm offsets are not."""
    from t2t_lite.optim.weight_decay import is_bias

    model, _ = build(tiny_hparams(), UPDATES)
    decayed = {
        v.path.split("/")[-1] for v in model.trainable_variables if not is_bias(v)
    }
    skipped = {v.path.split("/")[-1] for v in model.trainable_variables if is_bias(v)}
    assert decayed == {"kernel", "weights", "gamma"}
    assert skipped == {"bias", "beta"}
