"""SIGTERM/SIGINT as a request to stop cleanly between two micro-steps.

Schedulers pre-empt with SIGTERM and users press Ctrl-C. Dying at once would lose
everything since the last checkpoint; instead the loop finishes the current
micro-step, writes a checkpoint and exits 0. A second signal stops at once, for a
run that is stuck.
"""

import signal


class StopRequest:
    """Context manager: while active, SIGTERM/SIGINT set `requested` to their name."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = None
        self._previous = {}

    def _handle(self, signum, frame):
        del frame
        if self.requested is not None:  # second signal: give up waiting
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
        self.requested = signal.Signals(signum).name

    def __enter__(self):
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return False
