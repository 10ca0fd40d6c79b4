"""Batch-size schedules: tokens per update as a function of the update step, two
kinds of batch plan (optim/batch_plan.py, docs/batch.md).

- `linear:START,END,UPDATES`: a ramp from START to END tokens over UPDATES updates,
  then END.
- `steps:0=T0,U1=T1,...`: piecewise constant.

Window u holds n(u) = ceil(target(u) / micro_batch_tokens) micro-batches.
"""

import math

from t2t_lite.optim.batch_plan import (
    BatchPlan,
    BatchPlanError,
    integers,
    register_batch_plan,
)


class TokenSchedule(BatchPlan):
    """Tokens per update as a function of the update step: a linear ramp or
    piecewise-constant steps."""

    def __init__(self, text, kind, points, micro_batch_tokens):
        """points: linear ((0, START), (UPDATES, END)); steps ((U, T), ...)."""
        super().__init__(text, micro_batch_tokens)
        self.kind, self.points = kind, points

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

    def smallest_tokens(self):
        return min(tokens for _, tokens in self.points)

    def settled_from(self):
        return self.points[-1][0]


@register_batch_plan("linear")
def _linear(body, text, micro_batch_tokens):
    values = integers(body, "START,END,UPDATES", text)
    if len(values) != 3:
        raise BatchPlanError(
            f"batch_size_schedule '{text}': linear takes START,END,UPDATES (tokens, "
            "tokens, updates), e.g. linear:8192,65536,2000."
        )
    start, end, length = values
    if length < 1:
        raise BatchPlanError(
            f"batch_size_schedule '{text}': the ramp must last >= 1 update."
        )
    return TokenSchedule(
        text, "linear", ((0, start), (length, end)), micro_batch_tokens
    )


@register_batch_plan("steps")
def _steps(body, text, micro_batch_tokens):
    points = []
    for item in body.split(","):
        update, sep, tokens = item.partition("=")
        if not sep:
            raise BatchPlanError(
                f"batch_size_schedule '{text}': steps takes UPDATE=TOKENS pairs, "
                "e.g. steps:0=8192,1000=32768."
            )
        points.append(tuple(integers(f"{update},{tokens}", "UPDATE=TOKENS", text)))
    firsts = [u for u, _ in points]
    if firsts[0] != 0 or firsts != sorted(set(firsts)):
        raise BatchPlanError(
            f"batch_size_schedule '{text}': the updates must start at 0 and increase."
        )
    return TokenSchedule(text, "steps", tuple(points), micro_batch_tokens)
