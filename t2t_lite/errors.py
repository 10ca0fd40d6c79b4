"""The base of every user-facing error.

The CLIs catch UserError and print its message as one line, without a traceback
(DESIGN.md §6); anything else is a bug in t2t_lite and keeps its traceback.
"""


class UserError(ValueError):
    """A mistake in the user's input; str() is a one-line message naming that input."""
