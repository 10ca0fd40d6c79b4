"""Checkpoints that are never trusted blindly and never written from bad weights.

TensorFlow's V2 checkpoint writer already makes a save atomic enough: shards are
written under temporary names and renamed at the end, and the `checkpoint` state file
is replaced atomically, so a crash mid-save leaves the previous state visible. What it
does not do is recover: if the newest checkpoint is damaged afterwards (truncated data
file, bad sector, a copy gone wrong), `restore` fails and the run is stuck. Every
tensor carries a CRC32C in the index, so damage is detected on restore; here a damaged
newest checkpoint is reported by name and the previous one is used.
"""

import tensorflow as tf
from absl import logging

from t2t_lite.errors import UserError

# What a damaged or mismatched checkpoint raises while being restored.
_RESTORE_ERRORS = (
    tf.errors.OpError,
    ValueError,
    AssertionError,
    IndexError,  # "Read less bytes than requested" from a truncated data file
    KeyError,
    OSError,
)


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class CheckpointKeeper:
    """Saves with clear errors, restores the newest readable checkpoint."""

    def __init__(self, checkpoint, directory, max_to_keep, variables):
        self.checkpoint = checkpoint
        self.directory = directory
        self.manager = tf.train.CheckpointManager(
            checkpoint, directory, max_to_keep=max_to_keep, checkpoint_name="model"
        )
        self._all_finite = tf.function(
            lambda: tf.reduce_all(
                [tf.reduce_all(tf.math.is_finite(v)) for v in variables]
            )
        )

    @property
    def latest(self):
        return self.manager.latest_checkpoint

    def restore_newest_readable(self):
        """Restores the newest checkpoint that reads back intact; returns its path.

        Returns None when the directory has no checkpoint. Raises UserError when it
        has some but none of them is readable.
        """
        candidates = list(reversed(self.manager.checkpoints))
        for path in candidates:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
                return path
            except _RESTORE_ERRORS as e:
                logging.warning(
                    "Checkpoint %s is damaged or does not match this model (%s); "
                    "trying the previous one.",
                    path,
                    _first_line(e),
                )
        if candidates:
            raise UserError(
                f"no readable checkpoint in --output_dir '{self.directory}' (tried "
                f"{len(candidates)}); use a new --output_dir."
            )
        return None

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
            return self.manager.save(checkpoint_number=number)
        except (OSError, tf.errors.OpError) as e:
            raise UserError(
                f"cannot write checkpoint {number} to --output_dir "
                f"'{self.directory}': {_first_line(e)}; the checkpoints already "
                "there are intact."
            ) from None
