"""Checkpoint averaging (T2T's avg_checkpoints / t2t-avg-all).

Averaging the weights of the last few checkpoints of a run usually gains 0.5-1 BLEU
over the last checkpoint alone. This works on the checkpoint files themselves, with no
model construction: every floating-point tensor is averaged across the checkpoints
(in float64, cast back), everything else (step counters, RNG states, the serialized
object graph) is copied from the newest one. Since the object graph is the newest
checkpoint's, the result restores exactly like it, into `tf.train.Checkpoint(model=...)`
as well as into the full training checkpoint.

The result goes to a separate directory, never into the run's own: it would become
the "newest checkpoint" of the training series and be resumed from.
"""

import glob
import os
import re
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_lite.errors import UserError, first_line
from t2t_lite.fileio import write_atomically
from t2t_lite.outputs.checkpoints import checkpoints_on_disk
from t2t_lite.outputs.run_files import HPARAMS_FILE, RUN_FILE

_STATE_FILE = "checkpoint"
_BUNDLE_FILE = re.compile(r"^model-\d+\.(index|data-\d+-of-\d+)$")


def check_output_dir(model_dir, output_dir, overwrite=False):
    """UserError unless output_dir is another directory than model_dir and holds no
    checkpoint (or overwrite); cheap, so callers check before any reading."""
    if os.path.realpath(model_dir) == os.path.realpath(output_dir):
        raise UserError(
            f"output_dir '{output_dir}' is model_dir: the average would join the "
            "training series and be resumed from; use another output_dir."
        )
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UserError(f"output_dir '{output_dir}' is a file, not a directory.")
    if os.path.isdir(output_dir) and not overwrite:
        holds = checkpoints_on_disk(output_dir) or os.path.exists(
            os.path.join(output_dir, _STATE_FILE)
        )
        if holds:
            raise UserError(
                f"output_dir '{output_dir}' already holds a checkpoint; set "
                "overwrite to replace it, or use another output_dir."
            )


def _reader(prefix):
    try:
        return tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise UserError(f"cannot read checkpoint {prefix}: {first_line(e)}") from None


def _signature(reader):
    """{key: (shape, dtype)} of a checkpoint."""
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    return {key: (tuple(shapes[key]), dtypes[key]) for key in shapes}


def _check_compatible(newest, newest_signature, other, other_signature):
    """One-line error naming both checkpoints and the first key that differs."""
    only = (
        (other, set(other_signature) - set(newest_signature)),
        (newest, set(newest_signature) - set(other_signature)),
    )
    for holder, keys in only:
        if keys:
            raise UserError(
                f"checkpoints {other} and {newest} hold different variables: "
                f"{min(keys)} is in {holder} only; they are not from the same model."
            )
    for key in sorted(newest_signature):
        (shape, dtype), (other_shape, other_dtype) = (
            newest_signature[key],
            other_signature[key],
        )
        # Only averaged (floating) tensors must agree in shape: the rest is copied
        # from the newest, and a serialized iterator state changes size as it runs.
        if dtype != other_dtype or (dtype.is_floating and shape != other_shape):
            shape_a, dtype_a = other_signature[key]
            shape_b, dtype_b = newest_signature[key]
            raise UserError(
                f"checkpoints {other} and {newest} differ in {key}: "
                f"{dtype_a.name}{list(shape_a)} vs {dtype_b.name}{list(shape_b)}; "
                "they are not from the same model."
            )


def _read_error(what, prefix, error):
    return UserError(
        f"cannot read {what} from checkpoint {prefix}: {first_line(error)}"
    )


def _float64(reader, prefix, key):
    try:
        return reader.get_tensor(key).astype(np.float64)
    except (tf.errors.OpError, IndexError) as e:  # IndexError: a truncated data file
        raise _read_error(key, prefix, e) from None


def _copied(prefix, signature):
    """{key: tf.Tensor} of every non-floating tensor, read as TF reads it: the input
    iterator's state is a DT_VARIANT, which has no numpy form."""
    keys = sorted(k for k, (_, dtype) in signature.items() if not dtype.is_floating)
    try:
        values = tf.raw_ops.RestoreV2(
            prefix=prefix,
            tensor_names=keys,
            shape_and_slices=[""] * len(keys),
            dtypes=[signature[k][1] for k in keys],
        )
    except (tf.errors.OpError, IndexError) as e:
        raise _read_error("the non-float tensors", prefix, e) from None
    return dict(zip(keys, values))


def _averaged_tensors(prefixes):
    """{key: value} over the newest checkpoint's keys (`prefixes`, newest last):
    floating-point tensors averaged, the rest (step counters, RNG and iterator
    states, _CHECKPOINTABLE_OBJECT_GRAPH) copied from the newest.

    Holds one checkpoint's worth of tensors in memory, plus one tensor per reader.
    """
    readers = [_reader(p) for p in prefixes]
    signatures = [_signature(r) for r in readers]
    for prefix, signature in zip(prefixes[:-1], signatures[:-1]):
        _check_compatible(prefixes[-1], signatures[-1], prefix, signature)
    tensors = _copied(prefixes[-1], signatures[-1])
    for key, (_, dtype) in signatures[-1].items():
        if dtype.is_floating:
            total = sum(_float64(r, p, key) for r, p in zip(readers, prefixes))
            tensors[key] = (total / len(readers)).astype(dtype.as_numpy_dtype)
    return tensors


def _save(tensors, prefix):
    """Writes a V2 checkpoint bundle (prefix.index, prefix.data-00000-of-00001)."""
    keys = sorted(tensors)
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=keys,
        shape_and_slices=[""] * len(keys),
        tensors=[tf.convert_to_tensor(tensors[k]) for k in keys],
    )


def _checkpoint_files(directory):
    return [
        os.path.join(directory, name)
        for name in os.listdir(directory)
        if _BUNDLE_FILE.match(name)
    ]


def _install(tmp_prefix, output_dir, model_dir, name):
    """Moves the written bundle into output_dir in an order that never shows a half
    checkpoint: old state file and checkpoints go first (indexes before data), the
    new data before its index, the new state file last."""
    state = os.path.join(output_dir, _STATE_FILE)
    if os.path.exists(state):
        os.remove(state)
    old = _checkpoint_files(output_dir)
    for path in sorted(old, key=lambda p: not p.endswith(".index")):
        os.remove(path)
    for filename in (HPARAMS_FILE, RUN_FILE):
        source = os.path.join(model_dir, filename)
        if os.path.exists(source):
            with open(source) as f:
                write_atomically(os.path.join(output_dir, filename), f.read())
        else:
            logging.warning(
                "%s has no %s; the average has none either.", model_dir, filename
            )
    new = glob.glob(glob.escape(tmp_prefix) + ".*")
    for path in sorted(new, key=lambda p: p.endswith(".index")):
        suffix = path[len(tmp_prefix) :]
        os.replace(path, os.path.join(output_dir, name + suffix))
    write_atomically(
        state,
        f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n',
    )


def newest_checkpoints(model_dir, n):
    """[(step, prefix)] of the newest `n` checkpoints in model_dir, oldest
    first. Fewer on disk: all of them, with a warning. None, or n < 1:
    UserError.
    """
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}.")
    if not os.path.isdir(model_dir):
        raise UserError(f"model_dir '{model_dir}' is not a directory.")
    found = checkpoints_on_disk(model_dir)
    if not found:
        raise UserError(f"model_dir '{model_dir}' holds no model-N.index checkpoint.")
    if len(found) < n:
        logging.warning(
            "Asked to average %d checkpoints, but %s holds only %d; averaging those.",
            n,
            model_dir,
            len(found),
        )
    return found[-n:]


def write_average(checkpoints, model_dir, output_dir):
    """Writes the average of `checkpoints` ([(step, prefix)], oldest first) to
    output_dir/model-N, N the newest step; returns that prefix.

    hparams.json and run.json are copied from model_dir, so output_dir decodes like
    the run. Raises UserError for incompatible checkpoints. The caller has checked
    output_dir with `check_output_dir` (average_checkpoints does).
    """
    tensors = _averaged_tensors([prefix for _, prefix in checkpoints])
    name = f"model-{checkpoints[-1][0]}"
    try:
        os.makedirs(output_dir, exist_ok=True)
        tmp_dir = tempfile.mkdtemp(prefix=".avg-tmp-", dir=output_dir)
    except OSError as e:
        raise UserError(
            f"cannot create output_dir '{output_dir}': {e.strerror}."
        ) from None
    try:
        _save(tensors, os.path.join(tmp_dir, name))
        _install(os.path.join(tmp_dir, name), output_dir, model_dir, name)
    except (OSError, tf.errors.OpError) as e:
        raise UserError(
            f"cannot write the average to output_dir '{output_dir}': {first_line(e)}"
        ) from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return os.path.join(output_dir, name)


def average_checkpoints(model_dir, output_dir, n, overwrite=False):
    """Averages the newest `n` checkpoints of model_dir into output_dir;
    returns the written checkpoint's prefix (see write_average). Every argument is
    checked before anything is read or written."""
    check_output_dir(model_dir, output_dir, overwrite)
    checkpoints = newest_checkpoints(model_dir, n)
    return write_average(checkpoints, model_dir, output_dir)
