"""Progress accounting for log lines: loss per token, tokens/s and the ETA."""

import math
import time


class ThroughputMeter:
    """Loss per token and target tokens/s since the last `take()`, and the ETA.

    Per-micro-step values stay tensors until `take()`, so logging does not force a
    host-device sync on every micro-step. `take()` also sets `grad_norm`: the mean
    pre-clipping gradient norm of the finite updates since the previous take (None
    if there were none).
    """

    def __init__(self, start_step, total_steps):
        self.step, self.total = start_step, total_steps
        self._outputs, self._windows = [], []
        self.grad_norm = None
        self.since = self._window_start = self._window_end = time.perf_counter()

    def add(self, out):
        self._outputs.append(out)
        if "window_tokens" in out:  # an update: totals over all replicas and workers
            self._windows.append(out)
            self._window_end = time.perf_counter()

    def take(self):
        """(loss per token, tokens/s, ETA in seconds) since the last take.

        Loss and tokens/s cover the accumulation windows closed since then, summed
        over all replicas of all workers (the update's all-reduced totals); with no
        window closed yet, this worker's micro-batches (one tensor per replica)."""
        now = time.perf_counter()
        elapsed = max(now - self.since, 1e-9)
        steps = len(self._outputs)
        if self._windows:
            loss_sum = sum(float(o["window_loss_sum"][0]) for o in self._windows)
            tokens = sum(float(o["window_tokens"][0]) for o in self._windows)
            seconds = max(self._window_end - self._window_start, 1e-9)
            self._window_start = self._window_end
            self.grad_norm = _finite_mean(
                float(o["grad_norm"][0]) for o in self._windows if "grad_norm" in o
            )
        else:
            loss_sum = sum(float(x) for o in self._outputs for x in o["loss_sum"])
            tokens = sum(float(x) for o in self._outputs for x in o["tokens"])
            seconds = elapsed
            self.grad_norm = None
        self.step += steps
        eta = (self.total - self.step) * elapsed / max(steps, 1)
        self._outputs, self._windows = [], []
        self.since = now
        return loss_sum / max(tokens, 1.0), tokens / seconds, eta


def _finite_mean(values):
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


# Beyond this an ETA says only that train_steps is out of reach (a run stopped by
# other means, e.g. a clock), so the line says that instead of a nine-digit hour count.
ETA_HORIZON_DAYS = 365


def format_seconds(seconds):
    if not math.isfinite(seconds):
        return "?"
    if seconds > ETA_HORIZON_DAYS * 86400:
        return f"over {ETA_HORIZON_DAYS} days"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
