"""The batch plan: how many micro-batches each accumulation window holds
(docs/design.md §2.7), one interface with one registry of kinds.

A run's update u is one accumulation window of `size(u)` micro-batches of
`micro_batch_tokens` tokens (batch_size × replicas, padding included), decided when
the window starts; `tokens(u)` is what that window is planned to hold. `build_training`
(training/opening/build.py) builds the run's plan once, with `plan_from_hparams`, and hands
the same object to the train step (which sizes windows with it), the learning-rate
schedule (which counts updates or tokens with it) and the loop.

Kinds, by hparams:

- `fixed`: optimizer_multistep_accumulate_steps = n, or effective_batch_size = T
  (n = ceil(T / micro_batch_tokens)), or batch_size_schedule `fixed:T`.
- `linear` and `steps` (optim/batch_schedule.py): tokens per update as a function of
  the update step.
- `adaptive` (optim/adaptive_batch.py): a target that follows the measured gradient
  noise scale; `time_optimal` (optim/time_optimal_batch.py): a target that weighs
  the noise scale against what an update costs in time.
- a user's own: a parser registered with `register_batch_plan` (docs/extending.md),
  selected by batch_size_schedule `NAME:ARGS`.

A kind is a `BatchPlan` subclass; what it does not override has a default that is
right for any plan whose windows depend on the update step alone.
"""

import math

from t2t_lite.errors import UserError
from t2t_lite.registry import BATCH_PLANS


class BatchPlanError(UserError):
    """A batch plan that cannot be used, in one line."""


class BatchPlan:
    """The interface every kind implements: at least `size(update)`.

    text: the batch_size_schedule value it was parsed from ("" for a fixed n).
    micro_batch_tokens: tokens of one micro-step over all replicas.
    """

    kind = "?"  # the registered name
    constant = False  # True only when every window holds the same n
    needs_noise_scale = False  # reads the measured gradient noise scale
    state = None  # checkpointed variables, made by create_state()

    def __init__(self, text, micro_batch_tokens):
        self.text = text
        self.micro_batch_tokens = micro_batch_tokens

    def size(self, update):
        """Micro-batches in window `update` (0-based), >= 1."""
        raise NotImplementedError

    def tokens(self, update):
        """Tokens (padding included, all replicas) window `update` is planned for."""
        return self.size(update) * self.micro_batch_tokens

    def smallest_tokens(self):
        """The fewest tokens per update the plan asks for: never less than one
        micro-batch (checked by parse_batch_size_schedule)."""
        return self.tokens(0)

    def settled_from(self):
        """The update from which window sizes no longer change, or None when
        unknown (then train_updates walks every window)."""
        return

    def train_updates(self, train_steps):
        """Updates that train_steps micro-batches give: whole windows, plus the
        fraction of the next window that the remaining micro-batches fill (factors
        that use train_steps, such as linear_decay, read it)."""
        updates, steps, settled = 0, 0, self.settled_from()
        while settled is None or updates < settled:
            n = self.size(updates)
            if steps + n > train_steps:
                return updates + (train_steps - steps) / n
            steps, updates = steps + n, updates + 1
        return updates + (train_steps - steps) / self.size(updates)

    def create_state(self):
        """Makes the plan's checkpointed variables (None: it has none); called
        once under the run's strategy scope."""
        return

    def adopt_state(self, other):
        """Takes over `other`'s checkpointed variables (a re-planned run keeps
        its state, training/opening/build.py replan)."""
        self.state = other.state

    def decide(self, update, noise_scale):
        """Called when window `update` starts, before size(update); returns
        (old, new) tokens per update when the plan changed its mind, else None."""
        del update, noise_scale
        return

    def observe(self, seconds, padded_tokens, closes_window):
        """Told, after each micro-step, how long it took on how many padded
        tokens and whether it updated (a plan that weighs time, e.g.
        time_optimal, measures what an update costs from it)."""
        del seconds, padded_tokens, closes_window

    def check_workers(self, workers):
        """Raises a one-line BatchPlanError when the plan cannot run on `workers`
        processes (e.g. one that decides from host timings, which differ)."""
        del workers

    def check_batch_size(self, batch_size, replicas):
        """Raises a one-line BatchPlanError when a window would hold less than one
        micro-batch of batch_size tokens on each of `replicas` replicas."""
        smallest, micro = self.smallest_tokens(), batch_size * replicas
        if smallest < micro:
            raise BatchPlanError(
                f"batch_size_schedule '{self.text}' asks for {smallest} tokens per "
                f"update, less than one micro-batch (batch_size {batch_size} × "
                f"{replicas} replica(s) = {micro} tokens)."
            )

    def check_hparams(self, hp):
        """Raises a one-line UserError for hparams this kind cannot work with."""
        del hp

    def largest_micro_batch(self, replicas):
        """The most tokens one replica's micro-batch may hold under this plan
        (batch_size=0's probe stops there, training/opening/auto_batch.py)."""
        return self.smallest_tokens() // replicas

    def describe(self):
        return f"batch_size_schedule {self.text}"


class FixedWindows(BatchPlan):
    """n micro-batches per update, every update."""

    kind = "fixed"
    constant = True

    def __init__(self, n, micro_batch_tokens, text="", asked=None):
        """asked: the tokens per update asked for (n is rounded up from it)."""
        super().__init__(text, micro_batch_tokens)
        self.n = n
        self.asked = asked

    def size(self, update):
        del update
        return self.n

    def smallest_tokens(self):
        return self.n * self.micro_batch_tokens if self.asked is None else self.asked

    def settled_from(self):
        return 0

    def train_updates(self, train_steps):
        return train_steps / self.n

    def describe(self):
        return f"{self.n} accumulation steps"


def register_batch_plan(name):
    """Decorator registering `parser(body, text, micro_batch_tokens) -> BatchPlan`
    as batch_size_schedule kind `name` (`name:body`; see docs/extending.md)."""

    def decorator(parser):
        BATCH_PLANS.add(name, parser)
        return parser

    return decorator


@register_batch_plan("fixed")
def _fixed(body, text, micro_batch_tokens):
    """`fixed:TOKENS`: the fewest whole micro-batches that hold TOKENS."""
    values = integers(body, "TOKENS", text)
    if len(values) != 1:
        raise BatchPlanError(
            f"batch_size_schedule '{text}': fixed takes TOKENS (per update), e.g. "
            "fixed:32768."
        )
    target = values[0]
    n = max(1, -(-target // micro_batch_tokens))
    return FixedWindows(n, micro_batch_tokens, text, asked=target)


def integers(body, what, text):
    """The comma-separated integers of a batch_size_schedule's body, or one line
    naming what was expected."""
    try:
        return [int(v) for v in body.split(",")]
    except ValueError:
        raise BatchPlanError(
            f"batch_size_schedule '{text}': {what} must be integers."
        ) from None


def parse_batch_size_schedule(text, batch_size, replicas=1):
    """The plan written as `KIND:BODY` (or `KIND` alone, for a kind with defaults)
    for micro-batches of batch_size tokens on `replicas` replicas. A plan that would
    make a window smaller than one micro-batch is an error, not silently rounded
    up."""
    micro = batch_size * replicas
    kind, sep, body = text.strip().partition(":")
    if kind not in BATCH_PLANS or (sep and not body):
        unknown = f"unknown kind '{kind}'; " if kind not in BATCH_PLANS else ""
        raise BatchPlanError(
            f"batch_size_schedule '{text}': {unknown}expected KIND:ARGS with KIND "
            "one of "
            f"{', '.join(BATCH_PLANS.names())} (e.g. linear:START,END,UPDATES, "
            "steps:0=T0,U1=T1,..., adaptive:MIN,MAX[,EVERY[,FRACTION]], "
            "time_optimal:MIN,MAX[,EVERY[,COST]], fixed:TOKENS)."
        )
    plan = BATCH_PLANS.get(kind)(body, text, micro)
    plan.check_batch_size(batch_size, replicas)
    return plan


def accumulate_steps(hp, replicas=1):
    """The fixed n >= 1 of a run on `replicas` replicas.

    optimizer_multistep_accumulate_steps, validated (0 and 1: no accumulation); or,
    when effective_batch_size (tokens per update) is set, the fewest micro-batches of
    batch_size tokens on every replica that reach it: ceil(effective_batch_size /
    (batch_size × replicas)). Then n depends on the replica count; the trainer
    records it and refuses a resume that would change it.
    """
    n = hp.optimizer_multistep_accumulate_steps
    if type(n) is not int:  # bool is an int subclass; refuse it too
        raise BatchPlanError(
            f"optimizer_multistep_accumulate_steps must be an integer, got {n!r}."
        )
    if n < 0:
        raise BatchPlanError(
            f"optimizer_multistep_accumulate_steps must be >= 0, got {n}."
        )
    target = hp.effective_batch_size
    if target > 0:
        micro = hp.batch_size * replicas
        if target < micro:
            raise BatchPlanError(
                f"effective_batch_size {target} is less than one micro-batch "
                f"(batch_size {hp.batch_size} × {replicas} replica(s) = {micro} "
                "tokens): raise it, or lower batch_size."
            )
        return -(-target // micro)
    return max(n, 1)


def plan_from_hparams(hp, replicas=1):
    """The run's plan: batch_size_schedule if set, else the fixed n of
    optimizer_multistep_accumulate_steps or effective_batch_size."""
    if hp.batch_size_schedule:
        return parse_batch_size_schedule(
            hp.batch_size_schedule, hp.batch_size, replicas
        )
    return FixedWindows(accumulate_steps(hp, replicas), hp.batch_size * replicas)


def largest_micro_batch(hp, replicas):
    """The most tokens one replica's micro-batch may hold before any micro-batch
    size is known (batch_size=0): beyond it a window holds less than one
    micro-batch, or the plan refuses it."""
    if hp.batch_size_schedule:
        return parse_batch_size_schedule(
            hp.batch_size_schedule, 1, 1
        ).largest_micro_batch(replicas)
    return math.ceil(hp.effective_batch_size / replicas)
