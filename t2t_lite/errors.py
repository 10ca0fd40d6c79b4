"""The base of every user-facing error, and the one helper that quotes others.

The CLIs catch UserError and print its message as one line, without a traceback
(docs/design.md §6); anything else is a bug in t2t_lite and keeps its traceback.
"""


class UserError(ValueError):
    """A mistake in the user's input; str() is a one-line message naming that input."""


def first_line(error):
    """The first non-empty line of an error's message (its type name if it has none):
    what a one-line UserError quotes of a library's multi-line error."""
    for line in str(error).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__
