"""How many micro-batches each accumulation window holds (docs/design.md §2.7).

A run's update u is one accumulation window of n(u) micro-batches, decided when the
window starts. Three kinds of plan:

- `FixedWindows(n)`: optimizer_multistep_accumulate_steps, or effective_batch_size
  (the constant token target): n(u) = n.
- `TokenSchedule`: hparam batch_size_schedule, tokens per update as a function of the
  update step, `linear:START,END,UPDATES` (a ramp from START to END tokens over
  UPDATES updates, then END) or `steps:0=T0,U1=T1,...` (piecewise constant);
  n(u) = ceil(target(u) / (batch_size × replicas)).
- `AdaptiveWindows` (optim/adaptive_batch.py): `adaptive:MIN,MAX[,EVERY]`, a
  target that follows the measured gradient noise scale.

The plans' `train_updates(train_steps)` is the number of updates that train_steps
micro-batches give under the plan — whole windows plus the fraction of the last,
unfinished one — which is train_steps / n for a fixed n. Schedule factors that use
train_steps (linear_decay) read it, so they end exactly at the plan's last update.
"""

import dataclasses
import math

from t2t_lite.errors import UserError
from t2t_lite.optim.adaptive_batch import DEFAULT_EVERY, AdaptiveWindows


class BatchScheduleError(UserError):
    """A batch-size schedule that cannot be used, in one line."""


@dataclasses.dataclass(frozen=True)
class FixedWindows:
    """n micro-batches per update, every update."""

    n: int
    micro_batch_tokens: int  # batch_size × replicas

    constant = True
    kind = "fixed"

    def size(self, update):
        del update
        return self.n

    def tokens(self, update):
        """Tokens per update (padding included) that window `update` is planned for."""
        return self.n * self.micro_batch_tokens

    def train_updates(self, train_steps):
        return train_steps / self.n

    def describe(self):
        return f"{self.n} accumulation steps"


@dataclasses.dataclass(frozen=True)
class TokenSchedule:
    """Tokens per update as a function of the update step: a linear ramp or
    piecewise-constant steps."""

    text: str
    kind: str  # "linear" or "steps"
    points: tuple  # linear: ((0, START), (UPDATES, END)); steps: ((U, T), ...)
    micro_batch_tokens: int

    constant = False

    def target(self, update):
        """The tokens per update asked for at update `update` (0-based)."""
        if self.kind == "linear":
            (_, start), (length, end) = self.points
            return start + (end - start) * min(update / length, 1.0)
        for first, tokens in reversed(self.points):
            if update >= first:
                return tokens
        raise AssertionError("steps schedules start at update 0")

    def size(self, update):
        return max(1, math.ceil(self.target(update) / self.micro_batch_tokens - 1e-9))

    def tokens(self, update):
        return self.size(update) * self.micro_batch_tokens

    def _last_change(self):
        """The update from which n(u) no longer changes."""
        return self.points[-1][0]

    def train_updates(self, train_steps):
        """Whole windows that fit in train_steps micro-batches, plus the fraction
        of the next window that the remaining micro-batches fill."""
        updates, steps, last_change = 0, 0, self._last_change()
        while updates < last_change:
            n = self.size(updates)
            if steps + n > train_steps:
                return updates + (train_steps - steps) / n
            steps, updates = steps + n, updates + 1
        return updates + (train_steps - steps) / self.size(updates)

    def describe(self):
        return f"batch_size_schedule {self.text}"


def _integers(text, what, schedule):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise BatchScheduleError(
            f"batch_size_schedule '{schedule}': {what} must be integers."
        ) from None
    return values


def _linear(body, text, micro):
    values = _integers(body, "START,END,UPDATES", text)
    if len(values) != 3:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': linear takes START,END,UPDATES (tokens, "
            "tokens, updates), e.g. linear:8192,65536,2000."
        )
    start, end, length = values
    if length < 1:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': the ramp must last >= 1 update."
        )
    return TokenSchedule(text, "linear", ((0, start), (length, end)), micro)


def _steps(body, text, micro):
    points = []
    for item in body.split(","):
        update, sep, tokens = item.partition("=")
        if not sep:
            raise BatchScheduleError(
                f"batch_size_schedule '{text}': steps takes UPDATE=TOKENS pairs, "
                "e.g. steps:0=8192,1000=32768."
            )
        points.append(tuple(_integers(f"{update},{tokens}", "UPDATE=TOKENS", text)))
    firsts = [u for u, _ in points]
    if firsts[0] != 0 or firsts != sorted(set(firsts)):
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': the updates must start at 0 and increase."
        )
    return TokenSchedule(text, "steps", tuple(points), micro)


def _adaptive(body, text, micro_batch_tokens):
    """`MIN,MAX[,EVERY]` → AdaptiveWindows (optim/adaptive_batch.py)."""
    try:
        values = [int(v) for v in body.split(",")]
    except ValueError:
        values = []
    if len(values) not in (2, 3):
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': adaptive takes MIN,MAX[,EVERY] (tokens, "
            "tokens, updates), e.g. adaptive:8192,262144,100."
        )
    minimum, maximum = values[:2]
    every = values[2] if len(values) == 3 else DEFAULT_EVERY
    if minimum > maximum:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': MIN {minimum} is larger than MAX {maximum}."
        )
    if every < 1:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': EVERY must be >= 1 update, got {every}."
        )
    return AdaptiveWindows(text, minimum, maximum, every, micro_batch_tokens)


def parse_batch_size_schedule(text, batch_size, replicas=1):
    """The plan written as `text` (see the module docstring) for micro-batches of
    batch_size tokens on `replicas` replicas. Every value that would make a window
    smaller than one micro-batch is an error, not silently rounded up."""
    micro = batch_size * replicas
    kind, sep, body = text.strip().partition(":")
    if not sep or not body:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': expected linear:START,END,UPDATES, "
            "steps:0=T0,U1=T1,... or adaptive:MIN,MAX[,EVERY]."
        )
    if kind == "linear":
        schedule = _linear(body, text, micro)
    elif kind == "steps":
        schedule = _steps(body, text, micro)
    elif kind == "adaptive":
        schedule = _adaptive(body, text, micro)
    else:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': unknown kind '{kind}' (linear, steps, "
            "adaptive)."
        )
    if kind == "adaptive" and schedule.minimum < 2 * batch_size:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}': MIN {schedule.minimum} must hold two "
            f"micro-batches (2 × batch_size {batch_size}) for the noise scale it "
            "follows to be measured."
        )
    smallest = min(tokens for _, tokens in schedule.points)
    if smallest < micro:
        raise BatchScheduleError(
            f"batch_size_schedule '{text}' asks for {smallest} tokens per update, less "
            f"than one micro-batch (batch_size {batch_size} × {replicas} replica(s) "
            f"= {micro} tokens)."
        )
    return schedule


def window_plan(hp, replicas=1):
    """The run's plan: batch_size_schedule if set, else the fixed n of
    optimizer_multistep_accumulate_steps or effective_batch_size."""
    from t2t_lite.optim.schedule import accumulate_steps

    text = getattr(hp, "batch_size_schedule", "")  # absent in older hparams.json
    if text:
        return parse_batch_size_schedule(text, hp.batch_size, replicas)
    return FixedWindows(accumulate_steps(hp, replicas), hp.batch_size * replicas)
