"""Progress accounting for log lines: loss per token, tokens/s and the ETA."""

import math
import time


class ThroughputMeter:
    """Loss per token and target tokens/s since the last `take()`, and the ETA.

    Per-micro-step values stay tensors until `take()`, so logging does not force a
    host-device sync on every micro-step.
    """

    def __init__(self, start_step, total_steps):
        self.step, self.total = start_step, total_steps
        self._outputs = []
        self.since = time.perf_counter()

    def add(self, out):
        self._outputs.append(out)

    def take(self):
        elapsed = max(time.perf_counter() - self.since, 1e-9)
        steps = len(self._outputs)
        # Each output holds one tensor per local replica.
        loss_sum = sum(float(x) for o in self._outputs for x in o["loss_sum"])
        tokens = sum(float(x) for o in self._outputs for x in o["tokens"])
        self.step += steps
        eta = (self.total - self.step) * elapsed / max(steps, 1)
        self._outputs = []
        self.since = time.perf_counter()
        return loss_sum / max(tokens, 1.0), tokens / elapsed, eta


def format_seconds(seconds):
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
