"""batch_size_schedule=time_optimal:MIN,MAX[,EVERY[,COST]] (or `time_optimal`: from
two micro-batches to 64): tokens per update that minimize the time to a loss, from
the measured gradient noise scale and what an update costs.

McCandlish et al. 2018 give the updates to reach a loss with B tokens per update as
S_min (1 + B_noise / B). If an update costs B·t + c seconds (t per token; c its own:
the optimizer's apply and, across devices, the all-reduce), the time to the loss is
S_min (1 + B_noise / B)(B·t + c), least at

    B* = √(B_noise · c / t)

the geometric mean of the noise scale and COST = c / t, the tokens one update's own
cost is worth. Following B_noise alone (the `adaptive` kind) is right when more
tokens per update cost no time (more replicas); when they are accumulated on the
devices you have, time follows tokens, and B* is the batch that pays. On one device
c is small beside a micro-batch, so B* stays below MIN and the plan stays there;
it grows where updates are dear (a slow all-reduce) or the noise scale is large
(late in long runs).

COST is measured unless given: the loop reports each micro-step's seconds and
padded tokens (`observe`); t is the accumulating micro-steps' seconds per token,
c what an updating micro-step takes beyond its tokens' share. Both are moving
averages in the checkpoint. Decisions follow the `adaptive` kind's limits (every
EVERY updates, never shrink, at most double, at most MAX) and are checkpointed, so a
resumed run keeps the batch it had; with COST measured, later decisions read the
timings of the machine they run on. Timings differ between processes, so a run of
several workers must give COST (check_workers): all of them must size windows
alike.
"""

import math

import tensorflow as tf

from t2t_lite.optim.adaptive_batch import (
    AdaptiveWindows,
    parse_limits,
    plan_variable,
)
from t2t_lite.optim.batch_plan import BatchPlanError, register_batch_plan

# Each process's first calls of the compiled step trace it: not a step's time.
TRACING_OBSERVATIONS = 3
# Micro-steps of each kind (accumulating, updating) the averages need first.
MEASURED_OBSERVATIONS = 10
# The timing averages' decay per observation: about the last 100 micro-steps.
TIMING_DECAY = 0.99


class TimeOptimalWindows(AdaptiveWindows):
    """The adaptive plan whose target is √(noise scale × COST)."""

    kind = "time_optimal"

    def __init__(self, text, minimum, maximum, every, micro_batch_tokens, **kwargs):
        """cost: COST in tokens, or None to measure it (see the module)."""
        self.given_cost = kwargs.pop("cost", None)
        super().__init__(text, minimum, maximum, every, micro_batch_tokens, **kwargs)
        self._untimed = {True: TRACING_OBSERVATIONS, False: TRACING_OBSERVATIONS}

    def create_state(self):
        """The adaptive state plus, per kind of micro-step (accumulating,
        updating), moving averages of seconds and padded tokens and a count."""
        state = super().create_state()
        with state.name_scope:
            state.timing = {
                kind: [
                    plan_variable(0.0, f"{kind}_seconds", tf.float64),
                    plan_variable(0.0, f"{kind}_tokens", tf.float64),
                    plan_variable(0, f"{kind}_count"),
                ]
                for kind in ("accumulate", "update")
            }
        return state

    def observe(self, seconds, padded_tokens, closes_window):
        if self.given_cost is not None or self.state is None:
            return
        if self._untimed[closes_window]:
            self._untimed[closes_window] -= 1
            return
        kind = "update" if closes_window else "accumulate"
        average_seconds, average_tokens, count = self.state.timing[kind]
        for average, value in (
            (average_seconds, seconds),
            (average_tokens, padded_tokens),
        ):
            average.assign(TIMING_DECAY * average + (1 - TIMING_DECAY) * value)
        count.assign_add(1)

    def _averages(self, kind):
        """(seconds, padded tokens) of a micro-step of `kind`, bias-corrected as
        Adam's moments are, or None before MEASURED_OBSERVATIONS of them."""
        average_seconds, average_tokens, count = self.state.timing[kind]
        count = int(tf.convert_to_tensor(count))
        if count < MEASURED_OBSERVATIONS:
            return None
        correction = 1 - TIMING_DECAY**count
        return (
            float(tf.convert_to_tensor(average_seconds)) / correction,
            float(tf.convert_to_tensor(average_tokens)) / correction,
        )

    def cost_tokens(self):
        """COST = c / t in tokens: given, or measured (None: not yet)."""
        if self.given_cost is not None:
            return self.given_cost
        if self.state is None:
            return None
        accumulate, update = self._averages("accumulate"), self._averages("update")
        if accumulate is None or update is None or accumulate[0] <= 0:
            return None
        seconds_per_token = accumulate[0] / accumulate[1]
        update_seconds, update_tokens = update
        return max(0.0, update_seconds / seconds_per_token - update_tokens)

    def wanted(self, noise_scale):
        cost = self.cost_tokens()
        if noise_scale is None or not math.isfinite(noise_scale) or cost is None:
            return None
        return math.sqrt(noise_scale * cost)

    def decision_facts(self):
        cost = self.cost_tokens()
        if cost is None:
            return "update cost not measured yet"
        how = "given" if self.given_cost is not None else "measured"
        return f"update cost ≈ {cost:.0f} tokens ({how})"

    def check_workers(self, workers):
        if workers > 1 and self.given_cost is None:
            raise BatchPlanError(
                f"batch_size_schedule '{self.text}' measures an update's cost from "
                f"this process's timings, which differ between the {workers} "
                "workers; give it as the fourth value (time_optimal:MIN,MAX,EVERY,"
                "COST, in tokens) so that all of them size windows alike."
            )

    def describe(self):
        cost = "measured" if self.given_cost is None else f"{self.given_cost:g} tokens"
        return (
            f"batch_size_schedule {self.text} (from {self.minimum} tokens per update, "
            f"toward √(noise scale × update cost, {cost}) every {self.every} "
            f"updates, at most {self.maximum})"
        )


@register_batch_plan("time_optimal")
def _time_optimal(body, text, micro_batch_tokens):
    """`MIN,MAX[,EVERY[,COST]]`, or nothing: from two micro-batches to 64, COST
    measured. MIN must hold two micro-batches, for the noise scale to be measured."""
    if not body:
        return TimeOptimalWindows.in_micro_batches(text, micro_batch_tokens)
    usage = BatchPlanError(
        f"batch_size_schedule '{text}': time_optimal takes MIN,MAX[,EVERY[,COST]] "
        "(tokens, tokens, updates, the tokens an update's own cost is worth; "
        "measured when left out), e.g. time_optimal:8192,262144,100."
    )
    minimum, maximum, every, fourth = parse_limits(body, text, usage)
    cost = None
    if fourth is not None:
        try:
            cost = float(fourth)
        except ValueError:
            raise usage from None
        if not 0 <= cost < math.inf:
            raise BatchPlanError(
                f"batch_size_schedule '{text}': COST must be a number of tokens "
                f">= 0, got {fourth}."
            )
    return TimeOptimalWindows(
        text, minimum, maximum, every, micro_batch_tokens, cost=cost
    )
