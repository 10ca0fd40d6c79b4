"""Sharded TFRecord files of {"inputs", "targets"} id sequences, and the manifest.

On disk, for a problem P in data_dir (T2T's shard naming):

    P-train-00000-of-00010 ... P-train-00009-of-00010   shuffled training shards
    P-dev-00000-of-00001                                 dev, in corpus order
    P-test-00000-of-00001                                test, if any, in corpus order
    P.manifest.json                                      written last: "complete"

Every record is a tf.train.Example with two int64 lists, "inputs" and "targets"
(T2T's format). Writers go through a temporary name and rename on completion, and the
manifest, listing the shards with their example counts and the vocabulary hash, is
written after all of them: a data_dir without it (an interrupted t2t-datagen) is
refused by readers, so a half-written shard can never be read as data.
"""

import json
import os
import re

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2

from t2t_lite.fileio import fsync, replace, temp_name, write_atomically
from t2t_lite.tf_data import without_autotuning

FORMAT_VERSION = 1
_FEATURES = {
    "inputs": tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64),
    "targets": tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64),
}
_FILE_SHUFFLE_SEED = 20170612  # any constant
_PARSE_BATCH = 256  # records parsed per call; parsing in batches is much cheaper


def serialize_example(inputs, targets):
    """Two id lists → the bytes of a tf.train.Example."""
    example = example_pb2.Example()
    feature = example.features.feature
    feature["inputs"].int64_list.value.extend(inputs)
    feature["targets"].int64_list.value.extend(targets)
    return example.SerializeToString()


def shard_name(problem_name, split, index, num_shards):
    return f"{problem_name}-{split}-{index:05d}-of-{num_shards:05d}"


def manifest_path(data_dir, problem_name):
    return os.path.join(data_dir, f"{problem_name}.manifest.json")


class ShardWriter:
    """Writes records to `paths` through temporary names; `close()` renames them.

    `write(record, shard)` appends to one shard. Leaving the `with` block because of
    an exception deletes the temporary files instead of renaming them.
    """

    def __init__(self, paths):
        self.paths = list(paths)
        self.counts = [0] * len(self.paths)
        self._writers = [tf.io.TFRecordWriter(temp_name(p)) for p in self.paths]

    def write(self, record, shard=0):
        self._writers[shard].write(record)
        self.counts[shard] += 1

    def close(self, keep=True):
        for writer, path in zip(self._writers, self.paths):
            writer.close()
            if keep:
                fsync(temp_name(path))  # on disk before the manifest says "complete"
                replace(temp_name(path), path)
            elif tf.io.gfile.exists(temp_name(path)):
                tf.io.gfile.remove(temp_name(path))
        self._writers = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._writers:
            self.close(keep=exc_type is None)


def read_records(path):
    """All records of one TFRecord file, as a list of bytes (read in big batches:
    one Python step per record would be the slowest part of t2t-datagen)."""
    records = []
    batches = tf.data.TFRecordDataset(path, buffer_size=1 << 22).batch(8192)
    batches = without_autotuning(batches)  # see t2t_lite/tf_data.py
    for batch in batches.as_numpy_iterator():
        records.extend(batch.tolist())
    return records


def shuffle_into(source_path, target_path, rng):
    """Copies the records of `source_path` in a random order into `target_path`
    (atomically), then deletes `source_path`. Returns the number of records."""
    records = read_records(source_path)
    order = rng.permutation(len(records))
    with ShardWriter([target_path]) as writer:
        for i in order:
            writer.write(records[i])
    os.remove(source_path)
    return len(records)


def remove_generated_files(data_dir, problem_name, tmp_dir=None):
    """Deletes every file t2t-datagen writes for `problem_name`, and temporaries.

    Called before (re)generating, after the manifest is gone, so that files of an
    interrupted run, of another num_shards or of a shared vocabulary replaced by
    separate ones never linger next to the new ones. Returns how many were deleted.
    """
    pattern = re.compile(
        rf"^{re.escape(problem_name)}"
        r"(-(train|dev|test)-\d{5}-of-\d{5}|-train-unshuffled-\d{5}"
        r"|-(dev|test)\.(source|target)\.txt"
        r"|\.vocab(\.(source|target))?\.(model|vocab)|\.manifest\.json)"
        r"(\.tmp-\d+)?$"
    )
    removed = 0
    for directory in {data_dir, tmp_dir or data_dir}:
        for name in os.listdir(directory):
            if pattern.match(name):
                os.remove(os.path.join(directory, name))
                removed += 1
    return removed


def write_manifest(data_dir, problem_name, manifest):
    text = json.dumps({"format": FORMAT_VERSION, **manifest}, indent=2, sort_keys=True)
    write_atomically(manifest_path(data_dir, problem_name), text.encode() + b"\n")


def read_manifest(data_dir, problem_name):
    """The manifest dict, or None if there is none (never generated or interrupted).

    Raises ValueError (with the path) if it exists but is unreadable.
    """
    path = manifest_path(data_dir, problem_name)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e})") from None
    if manifest.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format {manifest.get('format')!r}, "
            f"this t2t_lite reads {FORMAT_VERSION}"
        )
    return manifest


@tf.autograph.experimental.do_not_convert
def _parse_batch(serialized):
    parsed = tf.io.parse_example(serialized, _FEATURES)
    return {k: tf.cast(v, tf.int32) for k, v in parsed.items()}


@tf.autograph.experimental.do_not_convert
def _open_shard(path):
    return tf.data.TFRecordDataset(path, buffer_size=1 << 20)


@tf.autograph.experimental.do_not_convert
def _as_dense(example):
    """Unbatched ragged rows have a RaggedTensorSpec that padded_batch rejects."""
    return {k: tf.identity(v) for k, v in example.items()}


def read_dataset(paths, *, shuffle_files, cycle_length=8):
    """Unbatched dataset of {"inputs", "targets"} int32 [None] from TFRecord shards.

    Shards are read in parallel (interleaved, deterministic order for a given seed);
    with `shuffle_files` the shard order is reshuffled every epoch. Records are parsed
    in batches of 256 and split again, which is several times cheaper than parsing one
    by one.
    """
    paths = list(paths)
    files = tf.data.Dataset.from_tensor_slices(paths)
    if shuffle_files and len(paths) > 1:
        # A fixed op seed: the order is reproducible, and still changes with the
        # global seed (tf.random.set_seed, which the trainer sets from its random_seed).
        files = files.shuffle(
            len(paths), seed=_FILE_SHUFFLE_SEED, reshuffle_each_iteration=True
        )
    dataset = files.interleave(
        _open_shard,
        cycle_length=max(1, min(cycle_length, len(paths))),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    dataset = dataset.batch(_PARSE_BATCH).map(
        _parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    return dataset.unbatch().map(_as_dense)


def length_percentiles(lengths):
    """{"p50", "p90", "p99", "max", "mean"} of a list of lengths (0s when empty)."""
    if len(lengths) == 0:
        return {"p50": 0, "p90": 0, "p99": 0, "max": 0, "mean": 0.0}
    values = np.asarray(lengths)
    p50, p90, p99 = np.percentile(values, [50, 90, 99], method="higher").tolist()
    return {
        "p50": int(p50),
        "p90": int(p90),
        "p99": int(p99),
        "max": int(values.max()),
        "mean": round(float(values.mean()), 2),
    }
