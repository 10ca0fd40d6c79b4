"""XLA (`t2t-trainer --xla`): bucket-padded batches and the XLA-compiled train step.

- Bucket padding (`make_dataset(..., pad_to_bucket=True)`) gives one batch shape per
  length bucket, keeps every example and the token budget, resumes across the switch,
  and never changes a batch's loss or gradient (the padding is id 0, masked).
- The XLA step (`build_training(..., jit_compile=True)`) gives the non-XLA step's weights
  after accumulated updates, traces once, and compiles once per batch shape: the
  compile count is read from XLA's own dump in a subprocess (this file run as a
  script, `python tests/test_xla.py`), which also checks XLA under MirroredStrategy
  (the CPU must be split into logical devices before TensorFlow starts).
- `t2t-trainer --xla` trains, and a run resumes across the switch.
"""

import collections
import glob
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from support import forked

if __name__ == "__main__":
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )

import keras
from support.accumulation_helpers import (
    VOCAB,
    build,
    random_batch,
    run,
    tiny_hparams,
    tolerance_ratio,
)
from support.cli_helpers import run_cli, tiny_trainer_flags

from t2t_lite.data import pipeline
from t2t_lite.training.opening import trainer_setup
from t2t_lite.training.opening.build import build_training
from t2t_lite.training.step.compiled import _BATCH_SIGNATURE

MAX_LENGTH = 32


def examples(count, lengths, seed=0):
    """(inputs, targets) of ids in [2, VOCAB) ending in EOS (1); each side's length
    drawn from `lengths`, independently."""
    rng = np.random.default_rng(seed)

    def sequence():
        n = int(rng.choice(lengths))
        return tuple(rng.integers(2, VOCAB, n - 1).tolist()) + (1,)

    return [(sequence(), sequence()) for _ in range(count)]


def to_dataset(pairs):
    """An unbatched, checkpointable dataset of the pairs."""
    return tf.data.Dataset.from_tensor_slices(
        {
            "inputs": tf.ragged.constant([p[0] for p in pairs], dtype=tf.int32),
            "targets": tf.ragged.constant([p[1] for p in pairs], dtype=tf.int32),
        }
    ).map(lambda ex: {k: tf.identity(v) for k, v in ex.items()})


def batches(pairs, pad_to_bucket, training=False, count=None, batch_size=256):
    dataset = pipeline.make_dataset(
        to_dataset(pairs),
        batch_size=batch_size,
        max_length=MAX_LENGTH,
        training=training,
        seed=3,
        pad_to_bucket=pad_to_bucket,
    )
    if count:
        dataset = dataset.take(count)
    return list(dataset.as_numpy_iterator())


def unpad(row):
    row = row.tolist()
    while row and row[-1] == 0:
        row.pop()
    return tuple(row)


def rows(batch):
    return [(unpad(s), unpad(t)) for s, t in zip(batch["inputs"], batch["targets"])]


def bucket_length(length):
    """The length a bucket-padded batch holding a row of `length` has: its bucket's
    upper bound - 1, max_length for the last bucket."""
    bounds = pipeline.bucket_boundaries(MAX_LENGTH) + [MAX_LENGTH + 1]
    return min(b for b in bounds if length < b) - 1


# --- the pipeline ----------------------------------------------------------------------


def test_bucket_padding_pads_both_sides_to_the_bucket_and_loses_nothing():
    pairs = examples(600, range(1, 41))
    kept = [p for p in pairs if max(map(len, p)) <= MAX_LENGTH]
    plain, padded = batches(pairs, False), batches(pairs, True)
    # Same batches, same order, only the padding differs.
    assert [rows(b) for b in padded] == [rows(b) for b in plain]
    assert collections.Counter(r for b in padded for r in rows(b)) == (
        collections.Counter(kept)
    )
    shapes = set()
    for batch in padded:
        longest = max(max(len(s), len(t)) for s, t in rows(batch))
        length = bucket_length(longest)
        assert batch["inputs"].shape[1] == batch["targets"].shape[1] == length
        assert batch["inputs"].shape[0] * length <= 256  # the token budget holds
        shapes.add(length)
    assert MAX_LENGTH in shapes  # the last bucket, [30, 32], is padded to max_length
    plain_shapes = {(b["inputs"].shape[1], b["targets"].shape[1]) for b in plain}
    assert len(shapes) < len(plain_shapes)


@pytest.mark.parametrize("before, after", [(False, True), (True, False)])
def test_a_checkpointed_iterator_resumes_across_the_switch(before, after, tmp_path):
    """Turning --xla on or off when resuming continues the same data: the padded
    pipeline only adds an empty last bucket and the padding."""
    pairs = examples(300, range(1, 33), seed=1)

    def iterator(pad):
        return iter(
            pipeline.make_dataset(
                to_dataset(pairs),
                batch_size=128,
                max_length=MAX_LENGTH,
                training=True,
                seed=3,
                pad_to_bucket=pad,
            )
        )

    uninterrupted, resumed = iterator(before), iterator(after)
    for _ in range(5):
        next(uninterrupted)
    path = tf.train.Checkpoint(it=uninterrupted).save(str(tmp_path / "it"))
    tf.train.Checkpoint(it=resumed).restore(path).assert_consumed()
    for _ in range(10):
        expected, got = next(uninterrupted), next(resumed)
        assert rows(_numpy(got)) == rows(_numpy(expected))


def _numpy(batch):
    return {k: v.numpy() for k, v in batch.items()}


def test_bucket_padding_never_changes_loss_or_gradients():
    """The real Transformer and loss, as the train step computes them (`_gradients`):
    the same loss sum, token count and gradients with and without bucket padding."""
    keras.utils.set_random_seed(7)
    _, step = _build(tiny_hparams(label_smoothing=0.1))  # no dropout
    gradients = tf.function(step._gradients, input_signature=_BATCH_SIGNATURE)
    pairs = examples(120, range(1, 33), seed=2)
    compared = 0
    for plain, padded in zip(batches(pairs, False), batches(pairs, True)):
        if plain["inputs"].shape == padded["inputs"].shape:
            continue  # nothing added
        (grads_a, loss_a, tokens_a), (grads_b, loss_b, tokens_b) = (
            gradients({k: tf.constant(v) for k, v in batch.items()})
            for batch in (plain, padded)
        )
        assert float(tokens_a) == float(tokens_b) > 0
        np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
        for g_a, g_b in zip(grads_a, grads_b):
            g_a, g_b = tf.convert_to_tensor(g_a), tf.convert_to_tensor(g_b)
            # Padded shapes make the matmul kernels sum in another order: rounding of a
            # few 1e-6 on these token-summed gradients (~0.1); one leaked padding
            # position would move them by ~1e-2.
            np.testing.assert_allclose(g_b, g_a, rtol=1e-5, atol=1e-5)
        compared += 1
    assert compared >= 3


# --- the XLA train step -----------------------------------------------------------------


def _start_weights(hp):
    keras.utils.set_random_seed(20261201)
    return build(hp, 8)[0].get_weights()


def _build(hp, start=None, jit_compile=False, strategy=None):
    """(model, TrainStep) through the trainer's own build_training."""
    run_ = build_training(
        hp,
        vocab_size=VOCAB,
        train_steps=8,
        initial_weights=start,
        strategy=strategy,
        jit_compile=jit_compile,
    )
    return run_.model, run_.step


def two_shape_micro_batches(count, seed=0):
    """`count` micro-batches of two shapes (one XLA compile each) whose non-pad token
    counts all differ."""
    rng = np.random.default_rng(seed)
    return [
        random_batch(rng, *((3, 6, 5) if i % 2 else (2, 9, 11))) for i in range(count)
    ]


@pytest.mark.parametrize(
    "optimizer, shared",
    [
        ("momentum", False),
        # The optimizer (like clipping and decay) runs outside XLA, on the gradients
        # the XLA function returns; one case each covers both settings.
        pytest.param("sgd", True, marks=pytest.mark.slow),
    ],
)
def test_xla_accumulated_updates_equal_the_non_xla_ones(optimizer, shared):
    """n=2, 4 updates with clipping and weight decay, at the tolerance of the
    accumulation tests, over micro-batches of two shapes. With unshared embeddings
    the embedding gradients leave XLA as IndexedSlices and are scattered into the
    accumulators. The XLA step traces once for both shapes."""
    hp = tiny_hparams(
        optimizer=optimizer,
        optimizer_multistep_accumulate_steps=2,
        shared_embedding_and_softmax_weights=shared,
        clip_grad_norm=1.0,
        weight_decay=0.01,
    )
    start = _start_weights(hp)
    micro = two_shape_micro_batches(8)
    assert len({int(np.count_nonzero(b["targets"])) for b in micro}) > 4
    models, losses = [], []
    for jit in (False, True):
        model, step = _build(hp, start, jit_compile=jit)
        outputs = [
            step.train_on(
                {k: tf.constant(v) for k, v in b.items()}, step.is_update_micro_step(i)
            )
            for i, b in enumerate(micro)
        ]
        assert step.update_step == 4 and step.micro_step == 8
        assert step.accumulate.experimental_get_tracing_count() == 1
        assert step.accumulate_and_update.experimental_get_tracing_count() == 1
        if jit:  # both call the one XLA function (compiled once per shape)
            assert step._gradients.experimental_get_tracing_count() == 1
        models.append(model)
        losses.append([float(out["loss_sum"][0]) for out in outputs])
    assert tolerance_ratio(models[1], models[0]) < 1.0
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    moved = [np.max(np.abs(w - s)) for w, s in zip(models[0].get_weights(), start)]
    assert max(moved) > 1e-4  # it trained


def test_xla_gradients_equal_the_non_xla_ones():
    """What XLA computes, compared directly (Adam would turn rounding noise in
    near-zero gradient elements into steps of up to the learning rate, so Adam's
    weights are not a fair float-tolerance comparison; SGD and momentum above are)."""
    hp = tiny_hparams(shared_embedding_and_softmax_weights=False)
    start = _start_weights(hp)
    batch = {k: tf.constant(v) for k, v in two_shape_micro_batches(1)[0].items()}
    (grads_a, loss_a, tokens_a), (grads_b, loss_b, tokens_b) = (
        _build(hp, start, jit_compile=jit)[1]._gradients(batch) for jit in (False, True)
    )
    assert float(tokens_a) == float(tokens_b)
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
    assert any(isinstance(g, tf.IndexedSlices) for g in grads_b)
    for g_a, g_b in zip(grads_a, grads_b):
        g_a, g_b = tf.convert_to_tensor(g_a), tf.convert_to_tensor(g_b)
        np.testing.assert_allclose(
            g_b, g_a, rtol=1e-5, atol=1e-6 * float(tf.reduce_max(tf.abs(g_a)))
        )


def two_bucket_batches(count):
    """`count` bucket-padded training batches of exactly two shapes: each side of
    every example 3-7 tokens (bucket [0, 8): padded to 7) or 26-27 (bucket
    [26, 28): padded to 27)."""
    pairs = examples(400, [3, 4, 5, 6, 7, 26, 27], seed=4)
    plain = batches(pairs, False, training=True, count=count, batch_size=128)
    padded = batches(pairs, True, training=True, count=count, batch_size=128)

    def shapes(batches):
        return {(b["inputs"].shape, b["targets"].shape) for b in batches}

    assert len(shapes(plain)) > 2  # each padded to its own longest row
    assert shapes(padded) == {((16, 7), (16, 7)), ((4, 27), (4, 27))}
    return padded


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """This file run as a script, one TensorFlow start-up for both checks: the XLA
    step over bucket-padded batches with XLA_FLAGS dumping every compile, then XLA
    under MirroredStrategy. Returns its JSON."""
    dump = str(tmp_path_factory.mktemp("xla_dump"))
    result = forked.run(
        [sys.executable, __file__, dump],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}"},
        cwd=os.path.dirname(__file__),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_xla_step_traces_once_over_bucket_shapes(script):
    compiles = script["compiles"]
    assert compiles["update_step"] == 6
    assert compiles["tracing_counts"] == [1, 1]  # accumulate, accumulate_and_update
    # Both call the same XLA function; XLA compiles it once per shape it meets
    # (counted in test_xla_compiles_once_per_bucket_shape).
    assert compiles["gradients_tracing_count"] == 1


@pytest.mark.slow
def test_xla_compiles_once_per_bucket_shape(script):
    compiles = script["compiles"]
    assert compiles["batches"] == 12 and compiles["shapes"] == 2
    assert len(compiles["compiled"]) == 2, compiles["dumped"][:20]


@pytest.mark.slow
def test_xla_under_mirrored_strategy_equals_non_xla(script):
    result = script["mirrored"]
    assert result["updates"] == 4
    assert result["tolerance_ratio"] < 1.0, result


# --- t2t-trainer --xla -------------------------------------------------------------------


@pytest.mark.slow
def test_cli_xla_trains_and_resumes_without_it(tmp_path, monkeypatch):
    seen = {"jit_compile": [], "pad_to_bucket": []}
    real_build_training = trainer_setup.build_training
    real_batches = trainer_setup.batches_from_hparams

    def build_training(*args, **kwargs):
        seen["jit_compile"].append(kwargs.get("jit_compile"))
        return real_build_training(*args, **kwargs)

    def batches_from_hparams(*args, **kwargs):
        if kwargs["training"]:
            seen["pad_to_bucket"].append(kwargs.get("pad_to_bucket"))
        return real_batches(*args, **kwargs)

    monkeypatch.setattr(trainer_setup, "build_training", build_training)
    monkeypatch.setattr(trainer_setup, "batches_from_hparams", batches_from_hparams)
    flags = [
        *tiny_trainer_flags("algorithmic_reverse"),
        f"--output_dir={tmp_path}",
        # One length bucket, [0, 16), for these examples of at most 13 tokens: every
        # padded batch has one shape, so XLA compiles once.
        (
            "--hparams=optimizer_multistep_accumulate_steps=2,min_length_bucket=16,"
            "length_bucket_step=2.0"
        ),
    ]
    first = run_cli("trainer", *flags, "--train_steps=4", "--xla")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Final eval at step 4 (update 2)" in first.stdout
    second = run_cli("trainer", *flags, "--train_steps=6")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resumed from" in second.stderr
    assert "Final eval at step 6 (update 3)" in second.stdout
    assert seen == {"jit_compile": [True, False], "pad_to_bucket": [True, False]}


# --- run as a script (subprocess checks) ---------------------------------------------------


def _compiles(dump):
    """12 steps over batches of two bucket shapes (XLA_FLAGS dumps each compile to
    `dump`; the compiles are listed before anything else compiles)."""
    padded = two_bucket_batches(12)
    hp = tiny_hparams(optimizer="momentum", optimizer_multistep_accumulate_steps=2)
    _, step = _build(hp, jit_compile=True)
    run(step, padded)
    return {
        "batches": len(padded),
        "shapes": len({b["targets"].shape for b in padded}),
        "update_step": step.update_step,
        "tracing_counts": [
            step.accumulate.experimental_get_tracing_count(),
            step.accumulate_and_update.experimental_get_tracing_count(),
        ],
        "gradients_tracing_count": step._gradients.experimental_get_tracing_count(),
        "compiled": glob.glob(
            os.path.join(dump, "*_gradients*before_optimizations.txt")
        ),
        "dumped": sorted(os.listdir(dump)),
    }


def _mirrored():
    """2 replicas × n=2 × 4 updates, with and without XLA, from the same weights, on
    bucket-padded batches as the trainer feeds XLA (two shapes, uneven token counts;
    16 distinct shapes made this test compile for minutes). Momentum: the optimizer
    runs outside XLA, and Adam's weights are no fair float-tolerance comparison
    (see test_xla_gradients_equal_the_non_xla_ones)."""
    hp = tiny_hparams(optimizer="momentum", optimizer_multistep_accumulate_steps=2)
    start = _start_weights(hp)
    micro = two_bucket_batches(16)
    models = []
    for jit in (False, True):
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        model, step = _build(hp, start, jit_compile=jit, strategy=strategy)
        for i in range(8):
            pair = micro[2 * i : 2 * i + 2]
            value = strategy.experimental_distribute_values_from_function(
                lambda context, pair=pair: {
                    k: tf.constant(v)
                    for k, v in pair[context.replica_id_in_sync_group].items()
                }
            )
            step.train_on(value, step.is_update_micro_step(i))
        models.append(model)
    return {
        "updates": step.update_step,
        "tolerance_ratio": tolerance_ratio(models[1], models[0]),
    }


if __name__ == "__main__":
    compiles = _compiles(sys.argv[1])
    print(json.dumps({"compiles": compiles, "mirrored": _mirrored()}))
