"""Tests for t2t_lite.data.pipeline: T2T bucket layout, token budget, no lost examples."""

import collections
import itertools

import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.data import pipeline
from t2t_lite.hparams_sets import transformer_test


def random_examples(num, max_len, seed=0):
    """(inputs, targets) tuples ending in EOS (1), symbols >= 2, no padding inside."""
    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(num):
        lengths = rng.integers(1, max_len + 1, size=2)
        inputs = tuple(rng.integers(2, 20, size=lengths[0] - 1).tolist()) + (1,)
        targets = tuple(rng.integers(2, 20, size=lengths[1] - 1).tolist()) + (1,)
        examples.append((inputs, targets))
    return examples


def to_dataset(examples):
    return tf.data.Dataset.from_tensor_slices(
        {
            "inputs": tf.ragged.constant([e[0] for e in examples], dtype=tf.int32),
            "targets": tf.ragged.constant([e[1] for e in examples], dtype=tf.int32),
        }
    ).map(lambda ex: {k: tf.identity(v) for k, v in ex.items()})


def unpad(row):
    """Strips trailing padding; exact because sequences end with EOS and hold no 0."""
    row = row.tolist()
    while row and row[-1] == 0:
        row.pop()
    return tuple(row)


def collect(dataset):
    """Returns (list of batch dicts as numpy, Counter of unpadded examples)."""
    batches = list(dataset.as_numpy_iterator())
    seen = collections.Counter()
    for batch in batches:
        for src, tgt in zip(batch["inputs"], batch["targets"]):
            seen[(unpad(src), unpad(tgt))] += 1
    return batches, seen


def test_bucket_boundaries_t2t_values():
    boundaries = pipeline.bucket_boundaries(256, 8, 1.1)
    assert boundaries[:19] == [
        8,
        9,
        10,
        11,
        12,
        13,
        14,
        15,
        16,
        17,
        18,
        19,
        20,
        22,
        24,
        26,
        28,
        30,
        33,
    ]
    assert boundaries[0] == 8
    assert all(a < b for a, b in itertools.pairwise(boundaries))
    assert boundaries[-1] < 256 and int(boundaries[-1] * 1.1) >= 256
    assert pipeline.bucket_boundaries(8) == []
    assert pipeline.bucket_boundaries(12, min_length=4, length_bucket_step=2.0) == [
        4,
        8,
    ]


def test_bucket_boundaries_rejects_bad_step():
    with pytest.raises(ValueError, match="length_bucket_step"):
        pipeline.bucket_boundaries(256, 8, 1.0)


def test_bucket_batch_sizes():
    assert pipeline.bucket_batch_sizes(4096, [8, 9, 10], 256) == [512, 455, 409, 15]
    assert pipeline.bucket_batch_sizes(8, [8, 9], 20) == [1, 1, 1]


@pytest.mark.parametrize("training", [False, True])
def test_full_pass_respects_budget_and_loses_nothing(training):
    batch_size, max_length = 64, 30
    examples = random_examples(600, 40)
    kept = [e for e in examples if max(map(len, e)) <= max_length]
    dropped = len(examples) - len(kept)
    assert 0 < dropped < len(examples) // 2  # The test data exercises the filter.

    dataset = pipeline.make_dataset(
        to_dataset(examples),
        batch_size=batch_size,
        max_length=max_length,
        training=training,
        seed=5,
        repeat=1 if training else None,
    )
    batches, seen = collect(dataset)
    assert seen == collections.Counter(kept)
    assert sum(seen.values()) == len(examples) - dropped
    for batch in batches:
        src, tgt = batch["inputs"], batch["targets"]
        assert src.shape[0] == tgt.shape[0] >= 1
        assert src.shape[0] * max(src.shape[1], tgt.shape[1]) <= batch_size
        assert max(src.shape[1], tgt.shape[1]) <= max_length
        # Padded to the batch's own longest row, not to the bucket boundary.
        assert src[:, -1].any() and tgt[:, -1].any()
        assert src.dtype == tgt.dtype == np.int32
    # Buckets actually group: short examples share batches (not all batches of one).
    assert len(batches) < len(kept) / 2
    assert max(b["inputs"].shape[0] for b in batches) >= 64 // 10


def test_eval_is_deterministic_and_seeded_training_is_reproducible():
    examples = random_examples(300, 20, seed=1)

    def run(training, seed):
        ds = pipeline.make_dataset(
            to_dataset(examples),
            batch_size=48,
            max_length=20,
            training=training,
            seed=seed,
            repeat=1,
        )
        return [
            (b["inputs"].tolist(), b["targets"].tolist())
            for b in ds.as_numpy_iterator()
        ]

    assert run(False, None) == run(False, None)
    assert run(True, 11) == run(True, 11)
    assert run(True, 11) != run(False, None)  # Training shuffles.


class _Listed:
    """A problem whose every split is `examples`, in order."""

    def __init__(self, examples):
        self.examples = examples

    def replica_dataset(self, split, data_dir, replica, num_replicas):
        return to_dataset(self.examples)


def test_the_shuffle_buffer_is_the_hparams_size():
    """All examples of one length: a batch holds the next ones the shuffle gives,
    so a buffer of one keeps the order and a buffer of all of them does not."""
    examples = [((i + 2, 3, 4, 1), (5, 6, 1)) for i in range(300)]

    def first_batch(size):
        hp = transformer_test().override(
            batch_size=40, max_length=10, shuffle_buffer_size=size
        )
        batches = pipeline.batches_from_hparams(
            _Listed(examples), hp, "train", training=True, seed=3
        )
        batch = next(iter(batches))
        return [int(row[0]) - 2 for row in batch["inputs"].numpy()]

    assert first_batch(1) == list(range(5))  # 40 tokens // the bucket's 8
    shuffled = first_batch(300)
    assert len(shuffled) == 5 and shuffled != list(range(5))


def test_training_repeats_forever_by_default():
    examples = random_examples(50, 10, seed=2)
    one_pass = len(
        list(
            pipeline.make_dataset(
                to_dataset(examples), batch_size=32, max_length=10, training=False
            )
        )
    )
    dataset = pipeline.make_dataset(
        to_dataset(examples), batch_size=32, max_length=10, training=True, seed=0
    )
    assert len(list(dataset.take(3 * one_pass))) == 3 * one_pass


@pytest.mark.parametrize("training", [True, False])
def test_iterators_run_without_the_autotuning_thread(training):
    """Deleting an iterator with tf.data's autotuning thread can stall the process
    for up to a minute (t2t_lite/tf_data.py); the trainer deletes one per
    evaluation."""
    examples = random_examples(20, 10, seed=4)
    dataset = pipeline.make_dataset(
        to_dataset(examples), batch_size=32, max_length=10, training=training
    )
    assert dataset.options().autotune.enabled is False
    assert to_dataset(examples).options().autotune.enabled is not False


def test_max_length_zero_means_batch_size():
    examples = random_examples(200, 40, seed=3)
    kept = [e for e in examples if max(map(len, e)) <= 32]
    assert len(kept) < len(examples)
    _, seen = collect(
        pipeline.make_dataset(
            to_dataset(examples), batch_size=32, max_length=0, training=False
        )
    )
    assert seen == collections.Counter(kept)


def test_sequence_longer_than_batch_size_gets_a_batch_of_one():
    # Documented exception to the budget: only possible when max_length > batch_size.
    examples = [((2,) * 14 + (1,), (3, 1)), ((2, 1), (3, 1))]
    batches, seen = collect(
        pipeline.make_dataset(
            to_dataset(examples), batch_size=8, max_length=20, training=False
        )
    )
    assert seen == collections.Counter(examples)
    assert sorted(b["inputs"].shape for b in batches) == [(1, 2), (1, 15)]


def test_batches_trace_a_tf_function_once():
    traces = []

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)] * 2)
    def step(inputs, targets):
        traces.append(1)
        return tf.reduce_sum(inputs) + tf.reduce_sum(targets)

    dataset = pipeline.make_dataset(
        to_dataset(random_examples(200, 30, seed=4)),
        batch_size=64,
        max_length=30,
        training=False,
    )
    assert dataset.element_spec["inputs"].shape.as_list() == [None, None]
    for batch in dataset:
        step(batch["inputs"], batch["targets"])
    assert len(traces) == 1


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"batch_size": 0, "max_length": 10}, "batch_size"),
        ({"batch_size": 16, "max_length": -1}, "max_length"),
        ({"batch_size": 16, "max_length": 10, "repeat": 0}, "repeat"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        pipeline.make_dataset(
            to_dataset(random_examples(5, 5)), training=False, **kwargs
        )


def test_dataset_without_targets_is_a_clear_error():
    dataset = tf.data.Dataset.from_tensor_slices({"inputs": [[2, 1]]})
    with pytest.raises(ValueError, match="targets"):
        pipeline.make_dataset(dataset, batch_size=16, max_length=8, training=False)
