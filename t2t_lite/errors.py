"""The base of every user-facing error, the helper that quotes others, and the test
that tells a lost peer of a multi-host run from any other TensorFlow error.

The CLIs catch UserError and print its message as one line, without a traceback
(docs/design.md §6); anything else is a bug in t2t_lite and keeps its traceback.
"""

import tensorflow as tf

# What a collective or the coordination service raises when another worker is gone
# (training/cluster/lost_worker.py words it for the user):
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.DeadlineExceededError,
    tf.errors.InternalError,
)
# What distinguishes a failed collective from any other op's error of those types:
_PEER_SIGNS = ("Collective", "heartbeat", "coordination service", "Coordination")


class UserError(ValueError):
    """A mistake in the user's input; str() is a one-line message naming that input."""


def first_line(error):
    """The first non-empty line of an error's message (its type name if it has none):
    what a one-line UserError quotes of a library's multi-line error."""
    for line in str(error).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__


def is_peer_failure(error):
    """Whether `error` is a collective or coordination failure, i.e. another
    worker is gone, not something wrong with this worker's own work."""
    return isinstance(error, _PEER_ERRORS) and any(
        sign in str(error) for sign in _PEER_SIGNS
    )
