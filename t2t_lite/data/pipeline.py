"""tf.data input pipeline with T2T's token-based length bucketing.

`batch_size` counts tokens per replica, padding included (T2T's meaning), not
sequences. Examples are grouped into length buckets so that a batch of short
sequences holds many of them and a batch of long ones few, keeping
`num_sequences * padded_length <= batch_size` with little padding. This is what
makes the tokens per micro-batch roughly constant, and why loss normalization must
count tokens (docs/design.md §2).

Bucket layout (values from T2T, docs/design.md §3): boundaries start at `min_length_bucket`
(8) and grow by `length_bucket_step` (1.1) up to `max_length`; a bucket with exclusive
upper bound `u` batches `batch_size // u` sequences. Examples longer than `max_length`
are dropped. One exception to the token budget: if `max_length > batch_size`, a
sequence longer than `batch_size` still forms a batch of one (it cannot be split);
keep `max_length <= batch_size` (or `max_length = 0`, meaning `batch_size`) to make
the budget strict.

Batch shapes: by default each batch is padded to its own longest row, so shapes vary
from batch to batch (the step's tf.function traces once for all of them). For XLA,
which compiles once per distinct shape, `pad_to_bucket=True` pads both inputs and
targets of a batch to its bucket's largest length (upper bound - 1; `max_length` for
the last bucket), so there is one shape per bucket. The extra padding is id 0, masked
everywhere, so it never changes the loss; it costs compute, not the token budget.
"""

import tensorflow as tf

from t2t_lite.constants import PAD_ID
from t2t_lite.tf_data import without_autotuning


def bucket_boundaries(max_length, min_length=8, length_bucket_step=1.1):
    """T2T's `_bucket_boundaries`: exclusive upper bounds of the length buckets.

    Geometric growth keeps the number of buckets small (about 40 for 256) while the
    padding inside a bucket stays under ~10%; the `x + 1` keeps short buckets distinct.
    """
    if length_bucket_step <= 1.0:
        raise ValueError(f"length_bucket_step must be > 1.0, got {length_bucket_step}.")
    if min_length < 1:
        raise ValueError(f"min_length must be >= 1, got {min_length}.")
    boundaries = []
    x = min_length
    while x < max_length:
        boundaries.append(x)
        x = max(x + 1, int(x * length_bucket_step))
    return boundaries


def bucket_batch_sizes(batch_size, boundaries, max_length):
    """Sequences per batch for each bucket (one more entry than `boundaries`).

    A bucket with exclusive upper bound `u` holds sequences of length < u, so
    `batch_size // u` of them stay within `batch_size` tokens. The last bucket ends
    at `max_length + 1` because lengths up to `max_length` are kept. Never below 1:
    a sequence longer than `batch_size` still gets a batch of its own.
    """
    return [
        max(1, batch_size // bound) for bound in list(boundaries) + [max_length + 1]
    ]


def example_length(example):
    """Length used for bucketing and filtering: the longer of inputs and targets.

    Both sides of a batch are padded to their own maximum, so the longer side is what
    the token budget has to bound.
    """
    return tf.maximum(tf.shape(example["inputs"])[0], tf.shape(example["targets"])[0])


def _check_args(batch_size, max_length, repeat):
    """One-line errors for bad arguments instead of a tf.data failure at run time."""
    for name, value, minimum in (
        ("batch_size", batch_size, 1),
        ("max_length", max_length, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    if repeat is not None and (
        isinstance(repeat, bool)
        or not isinstance(repeat, int)
        or (repeat < 1 and repeat != -1)
    ):
        raise ValueError(
            f"repeat must be None, -1 (forever) or a positive integer, got {repeat!r}."
        )


def _standardize(dataset):
    """Keeps only int32 "inputs"/"targets" as dense 1-D tensors.

    Guards against extra keys or a RaggedTensorSpec element (which `padded_batch`
    rejects) coming from a problem's dataset.
    """
    spec = dataset.element_spec
    if not isinstance(spec, dict) or not {"inputs", "targets"} <= set(spec):
        raise ValueError(
            "problem_dataset must yield dicts with 'inputs' and 'targets', "
            f"got element_spec {spec!r}."
        )
    return dataset.map(
        lambda ex: {
            k: tf.cast(tf.reshape(ex[k], [-1]), tf.int32) for k in ("inputs", "targets")
        }
    )


def make_dataset(
    problem_dataset,
    *,
    batch_size,
    max_length,
    min_length_bucket=8,
    length_bucket_step=1.1,
    training,
    shuffle_buffer=10000,
    seed=None,
    repeat=None,
    pad_to_bucket=False,
):
    """Token-batched, padded dataset of {"inputs": [b, src_len], "targets": [b, tgt_len]}.

    Args:
      problem_dataset: unbatched dataset of {"inputs": [None], "targets": [None]} ints.
      batch_size: tokens per batch (per replica), padding included.
      max_length: longest example kept (longer ones are dropped); 0 means batch_size.
      min_length_bucket, length_bucket_step: bucket layout, see `bucket_boundaries`.
      training: True shuffles (seeded, reshuffled every epoch) and by default repeats
        forever; False keeps the input order within buckets and makes one pass.
      shuffle_buffer: shuffle buffer size in examples (training only).
      seed: shuffle seed; None for a different order each run.
      repeat: None for the default above, -1 for forever, or a number of epochs.
      pad_to_bucket: pad every batch to its bucket's largest length (one shape per
        bucket, for XLA) instead of to its own longest row.

    Inputs and targets are padded with 0 separately, each to its own longest row in the
    batch (or both to the bucket's largest length); shapes are [None, None] so a
    tf.function traces once.
    """
    _check_args(batch_size, max_length, repeat)
    max_length = max_length or batch_size  # T2T: 0 means "as long as a batch".
    boundaries = bucket_boundaries(max_length, min_length_bucket, length_bucket_step)
    batch_sizes = bucket_batch_sizes(batch_size, boundaries, max_length)

    dataset = _standardize(problem_dataset)
    dataset = dataset.filter(lambda ex: example_length(ex) <= max_length)
    if training:
        dataset = dataset.shuffle(
            shuffle_buffer, seed=seed, reshuffle_each_iteration=True
        )
    if repeat is None:
        repeat = -1 if training else 1
    if repeat != 1:
        # Repeat before bucketing so partly filled buckets carry over between epochs
        # instead of being flushed as small batches at every epoch end.
        dataset = dataset.repeat(repeat)
    dataset = _bucket(dataset, boundaries, batch_sizes, max_length, pad_to_bucket)
    # Without autotuning: deleting its iterator (after every evaluation, at the end
    # of a run) must not wait on the autotuning thread (t2t_lite/tf_data.py).
    return without_autotuning(dataset.prefetch(tf.data.AUTOTUNE))


def _bucket(dataset, boundaries, batch_sizes, max_length, pad_to_bucket):
    """Batches of similar lengths, padded with PAD_ID (see make_dataset)."""
    if pad_to_bucket:
        # tf.data pads a bucket to (upper bound - 1) and refuses the unbounded last
        # bucket; closing the last bucket at max_length + 1 pads it to max_length.
        # The new, unbounded bucket stays empty: longer examples were dropped before.
        boundaries, batch_sizes = boundaries + [max_length + 1], batch_sizes + [1]
    return dataset.bucket_by_sequence_length(
        element_length_func=example_length,
        bucket_boundaries=boundaries,
        bucket_batch_sizes=batch_sizes,
        padded_shapes={"inputs": [None], "targets": [None]},
        padding_values={"inputs": PAD_ID, "targets": PAD_ID},
        pad_to_bucket_boundary=pad_to_bucket,
        drop_remainder=False,
    )


def batches_from_hparams(
    problem,
    hp,
    split,
    *,
    data_dir=None,
    training,
    seed=None,
    replica=0,
    num_replicas=1,
    pad_to_bucket=False,
):
    """`make_dataset` over `problem`'s shard `replica` of `num_replicas` of `split`,
    with the batching hparams (batch_size, max_length, bucket layout): what the
    trainer trains and evaluates on, for scripts that need the same batches.
    pad_to_bucket: one batch shape per bucket (the trainer's choice under XLA)."""
    return make_dataset(
        problem.replica_dataset(split, data_dir, replica, num_replicas),
        batch_size=hp.batch_size,
        max_length=hp.max_length,
        min_length_bucket=hp.min_length_bucket,
        length_bucket_step=hp.length_bucket_step,
        training=training,
        shuffle_buffer=hp.shuffle_buffer_size,
        seed=seed,
        pad_to_bucket=pad_to_bucket,
    )
