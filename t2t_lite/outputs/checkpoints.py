"""Checkpoints that are never trusted blindly and never written from bad weights.

TensorFlow's V2 checkpoint writer already makes a save atomic enough: shards are
written under temporary names and renamed at the end, and the `checkpoint` state file
is replaced atomically, so a crash mid-save leaves the previous state visible. What it
does not do is recover: if the newest checkpoint is damaged afterwards (truncated data
file, bad sector, a copy gone wrong), `restore` fails and the run is stuck. Every
tensor carries a CRC32C in the index, so damage is detected on restore; here a damaged
newest checkpoint is reported by name and the previous one is used.
"""

import contextlib
import os
import re

import tensorflow as tf
from absl import logging

from t2t_lite.errors import UserError, first_line, is_peer_failure
from t2t_lite.graph import graph_function

# What a damaged checkpoint raises while being restored: fall back to the previous
# one. Anything else (permission denied, an unavailable file system, a checkpoint of
# another model) is reported instead: falling back would silently roll the run back
# and later overwrite the newer, good checkpoint.
DAMAGE_ERRORS = (
    tf.errors.DataLossError,  # CRC mismatch, corrupt index
    tf.errors.NotFoundError,  # a missing shard
    tf.errors.OutOfRangeError,
    IndexError,  # "Read less bytes than requested" from a truncated data file
)
_STATE_FILE = "checkpoint"
# How tf.data says a saved iterator state belongs to another dataset graph: not
# damage (every checkpoint of the run would fail the same way).
_ITERATOR_MISMATCH = "Failed to restore dataset iterator"


class InputPipelineChanged(Exception):
    """The checkpoint's input-iterator state fits another tf.data pipeline (e.g. one
    of an earlier t2t_lite version); `path` names the checkpoint. The caller may
    restore everything else (restore_newest_readable(root=...) without iterators)."""

    def __init__(self, path):
        super().__init__(path)
        self.path = path


_INDEX = re.compile(r"^model-(\d+)\.index$")


def _step_number(prefix):
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def checkpoint_prefix(path):
    """RUN/model-2000.index or .data-00000-of-00001 -> RUN/model-2000 (a prefix is
    returned as it is): what users paste is often one of the checkpoint's files."""
    return re.sub(r"[.](index|data-[0-9]+-of-[0-9]+)$", "", path)


def checkpoints_on_disk(directory):
    """[(step, prefix)] of every model-N checkpoint in `directory`, oldest first.

    Found by their index files, not through the `checkpoint` state file, which may be
    damaged or list fewer than exist.
    """
    directory = str(directory)
    if not tf.io.gfile.isdir(directory):
        return []
    found = []
    for name in tf.io.gfile.listdir(directory):
        match = _INDEX.match(name)
        if match:
            prefix = os.path.join(directory, name[: -len(".index")])
            found.append((int(match.group(1)), prefix))
    return sorted(found)


class CheckpointKeeper:
    """Saves with clear errors, restores the newest readable checkpoint.

    keep_every_n_hours (T2T's keep_checkpoint_every_n_hours; 0/None: off): besides
    the newest max_to_keep, one checkpoint per that many hours is never deleted
    (tf.train.CheckpointManager's rule). optional: names of top-level checkpoint
    variables that checkpoints written by an earlier t2t_lite lack; restoring
    such a checkpoint leaves them at their current (initial) value instead of
    refusing it. stand_ins: a function returning {item name: object} that a save
    writes in place of those top-level items of the checkpoint (same keys), e.g.
    replica-local sums gathered at once (GradientAccumulator.summed).
    """

    def __init__(
        self,
        checkpoint,
        directory,
        max_to_keep,
        variables,
        keep_every_n_hours=None,
        optional=(),
        stand_ins=dict,
    ):
        self.checkpoint = checkpoint
        self._stand_ins = stand_ins
        self.directory = directory
        self._keep_hours = keep_every_n_hours or None
        self._optional = tuple(optional)
        if max_to_keep < 2:
            logging.warning(
                "keep_checkpoint_max=%d leaves no previous checkpoint to fall back "
                "to if the newest one is damaged.",
                max_to_keep,
            )
        self.manager = self._manager(max_to_keep)
        self._partial = False
        self._all_finite = graph_function(
            lambda: tf.reduce_all(
                [tf.reduce_all(tf.math.is_finite(v)) for v in variables]
            )
        )

    def _manager(self, max_to_keep):
        """A CheckpointManager; a damaged state file is moved aside, not trusted.

        The state file only lists checkpoints; the checkpoints themselves are found
        on disk by `_candidates`, so losing it loses nothing.
        """

        def make():
            return tf.train.CheckpointManager(
                self.checkpoint,
                self.directory,
                max_to_keep=max_to_keep,
                keep_checkpoint_every_n_hours=self._keep_hours,
                checkpoint_name="model",
            )

        try:
            return make()
        except (ValueError, tf.errors.OpError) as e:
            state = os.path.join(self.directory, _STATE_FILE)
            tf.io.gfile.rename(state, state + ".damaged", overwrite=True)
            logging.warning(
                "Checkpoint state file %s is damaged (%s); moved it to %s.damaged.",
                state,
                first_line(e),
                state,
            )
            return make()

    def allow_partial(self):
        """Restore without complaint about checkpoint values nothing here uses (e.g.
        input iterators of another replica count)."""
        self._partial = True

    def checkpointed_value(self, name, default):
        """The value of variable `name` (a top-level checkpoint item) in the newest
        checkpoint; `default` if that checkpoint lacks it, None if there is none."""
        latest = self.latest
        if latest is None:
            return None
        key = f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
        try:
            reader = tf.train.load_checkpoint(latest)
            return reader.get_tensor(key).item() if reader.has_tensor(key) else default
        except (tf.errors.OpError, ValueError, IndexError):  # damaged: restore says so
            return default

    @property
    def latest(self):
        candidates = self._candidates()
        return candidates[0] if candidates else None

    def _candidates(self):
        """Checkpoint prefixes on disk, newest first: those the state file lists
        and any model-N whose index file exists (the state file may be damaged)."""
        prefixes = set(self.manager.checkpoints)
        prefixes.update(prefix for _, prefix in checkpoints_on_disk(self.directory))
        return sorted(prefixes, key=_step_number, reverse=True)

    def restore_newest_readable(self, root=None, at_most=None):
        """Restores the newest checkpoint that reads back intact; returns its path.

        root: the tf.train.Checkpoint to restore into (default: the one saved; a
        caller passes one without input iterators after InputPipelineChanged);
        at_most: only checkpoints of that step or older (the step all workers of a
        multi-host run agreed on).
        Returns None when the directory has no checkpoint. Raises UserError when it
        has some but none is readable, or when one cannot be read for a reason
        other than damage; InputPipelineChanged when only the iterators do not fit.
        """
        candidates = self._candidates()
        if at_most is not None:
            candidates = [c for c in candidates if _step_number(c) <= at_most]
        if not candidates:
            return None
        root = root or self.checkpoint

        def restore(path):
            try:
                with _without_missing(root, path, self._optional):
                    status = root.restore(path)
                    if self._partial:
                        status.expect_partial()
                    status.assert_existing_objects_matched()
            except tf.errors.NotFoundError as e:
                if _ITERATOR_MISMATCH in str(e):
                    raise InputPipelineChanged(path) from None
                raise

        try:
            return restore_newest_readable(restore, candidates, self.directory)
        except UserError as e:
            raise UserError(f"{e} Use a new output_dir.") from None
        except (tf.errors.OpError, ValueError, AssertionError, OSError) as e:
            raise UserError(
                f"cannot restore checkpoint {e.path}: {first_line(e)} (is it from "
                "another model or t2t_lite version?); use a new output_dir."
            ) from None

    def save(self, number):
        """Writes checkpoint `number`; returns its path, or None if weights are bad.

        Non-finite weights (an update that overflowed) are never saved: the previous
        checkpoint stays the newest one. A failed write (disk full, permissions) is a
        one-line UserError; the checkpoints already written are untouched.
        """
        if not bool(self._all_finite()):
            logging.warning(
                "Not saving checkpoint %d: the weights hold NaN/Inf. The newest "
                "good checkpoint is %s.",
                number,
                self.latest,
            )
            return None
        try:
            with _standing_in(self.checkpoint, self._stand_ins()):
                return self.manager.save(checkpoint_number=number)
        except (OSError, tf.errors.OpError) as e:
            if is_peer_failure(e):
                # Reading replica-local variables for the save is a collective:
                # another worker is gone, the output_dir is fine. The trainer
                # says so (training/cluster/lost_worker.py).
                raise
            raise UserError(
                f"cannot write checkpoint {number} to output_dir "
                f"'{self.directory}': {first_line(e)}; the checkpoints already "
                "there are intact."
            ) from None


@contextlib.contextmanager
def _standing_in(root, stand_ins):
    """`root` with its items replaced by `stand_ins` (only items it has: a save
    must not add any), put back afterwards."""
    live = {name: getattr(root, name) for name in stand_ins if hasattr(root, name)}
    for name in live:
        setattr(root, name, stand_ins[name])
    try:
        yield
    finally:
        for name, value in live.items():
            setattr(root, name, value)


@contextlib.contextmanager
def _without_missing(root, path, names):
    """`root` without its items `names` that checkpoint `path` lacks (an older
    checkpoint); they are put back afterwards, so later saves include them."""
    missing = {}
    if names:
        try:
            reader = tf.train.load_checkpoint(path)
            has = reader.has_tensor
        except (tf.errors.OpError, ValueError):  # damaged: the restore reports it
            has = None
        for name in names if has else ():
            if hasattr(root, name) and not has(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"):
                missing[name] = getattr(root, name)
                delattr(root, name)
    try:
        yield
    finally:
        for name, value in missing.items():
            setattr(root, name, value)


def restore_newest_readable(restore, candidates, directory):
    """Calls `restore(path)` on each candidate prefix, newest first, until one reads
    back intact; returns that path.

    A damaged checkpoint (DAMAGE_ERRORS) is reported with a warning and the previous
    one is tried: a bad sector must not end a run that has older good checkpoints.
    Any other error is not damage (another model's checkpoint, permissions): it is
    raised with the failing path as `error.path`, since falling back would silently
    roll the run back. When every candidate is damaged: UserError naming the
    directory and the newest one's damage.
    """
    damage = None
    for path in candidates:
        try:
            restore(path)
            return path
        except DAMAGE_ERRORS as e:
            reason = first_line(e)
            damage = damage or reason
            logging.warning(
                "Checkpoint %s is damaged (%s); trying the previous one.", path, reason
            )
        except Exception as e:
            e.path = path
            raise
    raise UserError(
        f"no readable checkpoint in '{directory}': tried {len(candidates)}, all "
        f"damaged (newest: {candidates[0]}: {damage})."
    )
