"""batch_size=0 (auto): the largest micro-batch that fits, found before training,
with the update's size kept as asked (docs/design.md §2.7).

The worst case of a run's micro-batches is the longest length bucket: with
`batch_size` b it holds b // (max_length + 1) sentences of up to max_length tokens
(data/pipeline.py), and every shorter bucket holds as many tokens in shorter
sentences, so less attention memory. The probe therefore builds a throwaway run of
the same model, optimizer and accumulators and runs its full accumulate-and-update
step on batches of r sentences of max_length tokens on both sides, every replica
alike: r = 1, 2, 4, ... until one does not fit, then a bisection. A step fits when it
runs (on a GPU a step that does not raises ResourceExhaustedError) and, under
`memory_budget`, when the allocator's peak during it stays within the budget (on a
CPU, which would rather swap than fail, the budget is required). The micro-batch
chosen holds (1 - headroom) of the largest r, so that what the probe did not
exercise (fragmentation, another process) has room.

n then follows from effective_batch_size or batch_size_schedule as for any
batch_size, so the update is the one asked for whatever the device. The result
goes to run.json and a resumed run reuses it without probing: its windows were
sized with it.
"""

import dataclasses
import gc
import time

import tensorflow as tf

from t2t_lite.errors import UserError
from t2t_lite.training.build import build_run

GB = 10**9


@dataclasses.dataclass
class AutoBatch:
    """A probe's outcome, as recorded in run.json."""

    batch_size: int  # the micro-batch chosen, in tokens (the hparam's unit)
    sentences: int  # of max_length tokens, in the longest bucket's batch
    largest_sentences: int  # the most that ran within the limit
    max_length: int
    limit: str  # what bounded it
    probe_seconds: float
    probes: int  # steps tried

    def line(self):
        """The start-up line."""
        return (
            f"batch_size auto: {self.batch_size} tokens per micro-batch "
            f"({self.sentences} sentences of {self.max_length} tokens; the largest "
            f"that fit {self.limit} was {self.largest_sentences}) — probed in "
            f"{self.probe_seconds:.1f} s over {self.probes} steps"
        )


class AutoBatchError(UserError):
    """batch_size=0 cannot be resolved here, in one line."""


def probe_batch_size(
    hp,
    *,
    vocab_size,
    strategy,
    model,
    memory_budget_gb=0.0,
    headroom=0.1,
    max_sentences=None,
    simulated_memory=None,
    jit_compile=False,
):
    """The AutoBatch for hp (whose batch_size is 0) on `strategy`'s devices.

    max_sentences: no need to look further (e.g. the micro-batch that would make
    one window hold the whole update). simulated_memory: a
    training/out_of_memory.SimulatedMemory (tests, benchmarks)."""
    length = hp.max_length
    if length <= 0:
        raise AutoBatchError("batch_size=0 (auto) needs max_length > 0 (hparam).")
    device = _memory_device()
    if memory_budget_gb <= 0 and device.startswith("CPU") and not simulated_memory:
        raise AutoBatchError(
            "batch_size=0 (auto) on a CPU needs --memory_budget (GB): a CPU swaps "
            "rather than running out of memory, so nothing else bounds the probe."
        )
    budget = memory_budget_gb * GB if memory_budget_gb > 0 else None
    if budget is not None:
        _reset_peak(device)  # the allocator keeps statistics, or a clear error
    began = time.perf_counter()
    probe_hp = hp.copy().override(
        batch_size=length + 1,
        optimizer_multistep_accumulate_steps=2,  # accumulators, as the run's
        effective_batch_size=0,
        batch_size_schedule="",
    )
    run = build_run(
        probe_hp,
        vocab_size=vocab_size,
        train_steps=2,
        model=model,
        strategy=strategy,
        jit_compile=jit_compile,
    )
    run.step.simulated_memory = simulated_memory
    fits = _Fits(run, strategy, length, device, budget)
    largest = _largest(fits, max_sentences or 2**20)
    del run, fits.run
    gc.collect()
    if largest == 0:
        raise AutoBatchError(
            f"batch_size=0 (auto): not even one sentence pair of max_length {length} "
            f"tokens fits {_limit_text(budget)}; lower max_length or use "
            "recompute_grad=true"
        )
    sentences = max(1, int(largest * (1.0 - headroom)))
    return AutoBatch(
        batch_size=sentences * (length + 1),
        sentences=sentences,
        largest_sentences=largest,
        max_length=length,
        limit=_limit_text(budget),
        probe_seconds=round(time.perf_counter() - began, 1),
        probes=fits.count,
    )


def _largest(fits, cap):
    """The largest r <= cap with fits(r), assuming fits is monotone; 0 if none."""
    if not fits(1):
        return 0
    low, high = 1, None  # fits(low); not fits(high)
    while high is None and low < cap:
        candidate = min(low * 2, cap)
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    while high is not None and high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


class _Fits:
    """fits(r): whether the step on r sentences of `length` tokens runs within the
    limit."""

    def __init__(self, run, strategy, length, device, budget):
        self.run, self.strategy, self.length = run, strategy, length
        self.device, self.budget, self.count = device, budget, 0

    def __call__(self, sentences):
        self.count += 1
        batch = self._batch(sentences)
        if self.budget is not None:
            _reset_peak(self.device)
        try:
            self.run.step.probe(batch)
        except tf.errors.ResourceExhaustedError:
            return False
        if self.budget is None:
            return True
        peak = tf.config.experimental.get_memory_info(self.device)["peak"]
        return peak <= self.budget

    def _batch(self, sentences):
        # Non-pad ids: memory does not depend on which.
        ids = tf.fill([sentences, self.length], 2)
        share = {"inputs": ids, "targets": ids}
        if self.strategy.num_replicas_in_sync == 1:
            return share
        return self.strategy.experimental_distribute_values_from_function(
            lambda context: share
        )


def _memory_device():
    """The device whose allocator the budget is checked on: the first GPU, else
    the CPU."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def _reset_peak(device):
    try:
        tf.config.experimental.reset_memory_stats(device)
    except ValueError:
        raise AutoBatchError(
            f"--memory_budget needs allocator statistics, which TensorFlow keeps on "
            f"{device} only with its BFC allocator: set the environment variable "
            "TF_CPU_ALLOCATOR_USE_BFC=true."
        ) from None


def _limit_text(budget):
    if budget is None:
        return "in the device's memory"
    return f"in memory_budget {budget / GB:g} GB"
