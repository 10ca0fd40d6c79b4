"""batch_size=0 (auto): the largest micro-batch that fits, found before training,
with the update's size kept as asked (docs/memory.md, docs/design.md §2.7).

The worst case of a run's micro-batches is the longest length bucket: with
`batch_size` b it holds b // (max_length + 1) sentences of up to max_length tokens
(data/pipeline.py), and every shorter bucket holds as many tokens in shorter
sentences, so less attention memory. The probe runs the run's own full
accumulate-and-update step on batches of r sentences of max_length tokens on both
sides, every replica alike: r = 1, 2, 4, ... until one does not fit, then a
bisection. A step fits when it runs (on a GPU a step that does not raises
ResourceExhaustedError) and, under `memory_budget`, when the device allocator's peak
during it stays within the budget (on a CPU, which would rather swap than fail, the
budget is required). The budget is only checked with an allocator that counts every
tensor (_check_statistics): on a CPU that is TensorFlow's BFC allocator, not oneDNN's,
which leaves allocations under 256 KiB uncounted. The micro-batch chosen holds
(1 - headroom) of the largest r, so that what the probe did not exercise
(fragmentation, another process) has room.

It is the run's own step, not a copy: TensorFlow keeps the memory of a run that has
stepped even once its Python objects are gone, so a throwaway copy would leave the
real run less memory than was measured. Every variable the run checkpoints is copied
to the host first and put back afterwards, so the run starts as if never probed.

The search stops at the micro-batch that would hold a whole update (the first one of
a schedule): beyond it n cannot shrink. With effective_batch_size the micro-batch is
then evened out: n = ceil(tokens per update / fitted micro-batch), and the micro-batch
the smallest that reaches the update with that n, so an update is never much larger
than asked for.
"""

import dataclasses
import math
import time

import keras
import tensorflow as tf

from t2t_lite.errors import UserError

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

    @classmethod
    def from_record(cls, record, output_dir):
        try:
            return cls(**record)
        except TypeError:
            raise AutoBatchError(
                f"{output_dir}/run.json's auto_batch is not one this version "
                f"wrote ({record!r}); restore it or use a new output_dir."
            ) from None

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
    parts,
    *,
    memory_budget_gb=0.0,
    headroom=0.1,
    tokens_per_update,
    simulated_memory=None,
):
    """The AutoBatch of `parts` (built with batch_size max_length + 1) on their
    strategy's devices; their state is put back as it was before. tokens_per_update:
    optim/batch_plan.py's largest_micro_batch(). simulated_memory: a SimulatedMemory
    (tests, benchmarks)."""
    length = parts.hp.max_length
    device = _memory_device()
    if memory_budget_gb <= 0 and device.startswith("CPU") and not simulated_memory:
        raise AutoBatchError(
            "batch_size=0 (auto) on a CPU needs --memory_budget (GB): a CPU swaps "
            "rather than running out of memory, so nothing else bounds the probe."
        )
    cap = tokens_per_update // (length + 1)
    if cap < 1:
        raise AutoBatchError(
            f"batch_size=0 (auto): {tokens_per_update} tokens per update is less than "
            f"one sentence pair of max_length {length} (+1) per replica."
        )
    budget = memory_budget_gb * GB if memory_budget_gb > 0 else None
    if budget is not None:
        _check_statistics(device)  # the peak counts every tensor, or a clear error
    began = time.perf_counter()
    fits = _Fits(parts, length, device, budget, simulated_memory)
    saved = _host_copy(parts)
    try:
        largest = _largest(fits, cap)
    finally:
        _put_back(saved)
        parts.step.simulated_memory = None
    if largest == 0:
        raise AutoBatchError(
            f"batch_size=0 (auto): not even one sentence pair of max_length {length} "
            f"tokens fits {_limit_text(budget)}{fits.peak_text(1)}; lower max_length "
            "or use recompute_grad=true."
        )
    sentences = max(1, int(largest * (1.0 - headroom)))
    if not parts.hp.batch_size_schedule:  # the fewest sentences for the same n
        n = math.ceil(tokens_per_update / (sentences * (length + 1)))
        sentences = math.ceil(tokens_per_update / (n * (length + 1)))
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
    """fits(r): whether the parts' update step on r sentences of `length` tokens
    runs within the limit."""

    def __init__(self, parts, length, device, budget, simulated_memory):
        self.parts, self.length = parts, length
        self.device, self.budget = device, budget
        self.count = 0
        self.peaks = {}  # sentences: the allocator's peak in bytes, under a budget
        parts.step.simulated_memory = simulated_memory

    def __call__(self, sentences):
        self.count += 1
        batch = self._batch(sentences)
        if self.budget is not None:
            tf.config.experimental.reset_memory_stats(self.device)  # the peak from here
        try:
            self.parts.step.probe(batch)
        except tf.errors.ResourceExhaustedError:
            return False
        if self.budget is None:
            return True
        self.peaks[sentences] = tf.config.experimental.get_memory_info(self.device)[
            "peak"
        ]
        return self.peaks[sentences] <= self.budget

    def peak_text(self, sentences):
        """What the step on `sentences` peaked at, for a message; '' if unmeasured."""
        if sentences not in self.peaks:
            return ""
        return f" (its step peaked at {self.peaks[sentences] / GB:.3g} GB)"

    def _batch(self, sentences):
        # Non-pad ids: memory does not depend on which.
        ids = tf.fill([sentences, self.length], 2)
        share = {"inputs": ids, "targets": ids}
        strategy = self.parts.strategy
        if strategy.num_replicas_in_sync == 1:
            return share
        return strategy.experimental_distribute_values_from_function(
            lambda context: share
        )


def _state_variables(parts):
    """Every variable the parts' checkpoint holds (weights, slots, counters,
    accumulators, dropout generators, loss scale, noise scale)."""
    checkpoint = parts.checkpoint()
    found = []
    for item in tf.train.TrackableView(checkpoint).descendants():
        if isinstance(item, (tf.Variable, keras.Variable)):
            found.append(item)
    return found


def _host_copy(parts):
    return [(v, tf.convert_to_tensor(v).numpy()) for v in _state_variables(parts)]


def _put_back(saved):
    for variable, value in saved:
        variable.assign(value)


def _memory_device():
    """The device whose allocator the budget is checked on: the first GPU, else
    the CPU."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


# A tensor well under the 256 KiB below which oneDNN's CPU allocator hands requests
# to an allocator it keeps no statistics for.
_COUNTED_BYTES = 1024


def _check_statistics(device):
    """Refuses a budget that the allocator's peak would not bound: the allocator
    must keep statistics and count a small tensor.

    On a CPU, TensorFlow's device allocator is its BFC allocator with
    TF_CPU_ALLOCATOR_USE_BFC=true, read when the process first creates a device.
    Otherwise it is oneDNN's (where TensorFlow enables oneDNN, which depends on the
    CPU) or a plain one. The plain one keeps no statistics; oneDNN's counts only
    allocations of 256 KiB and more, so the peak of a small model's step reads 0
    and would let any budget pass. Allocating a tensor and reading it back checks
    the allocator in use, whatever the environment and the CPU."""
    try:
        # The peak, unlike the bytes in use, does not drop if another thread frees.
        tf.config.experimental.reset_memory_stats(device)
        before = tf.config.experimental.get_memory_info(device)["peak"]
        with tf.device(device):
            tensor = tf.fill([_COUNTED_BYTES // 4], 1.0)  # a kernel's output
        counted = tf.config.experimental.get_memory_info(device)["peak"] - before
        del tensor
    except ValueError:  # no statistics at all
        counted = None
    if counted is not None and counted >= _COUNTED_BYTES:
        return
    found = (
        "keeps no statistics"
        if counted is None
        else f"counted {counted} bytes of a {_COUNTED_BYTES}-byte tensor"
    )
    fix = (
        "start the process with the environment variable TF_CPU_ALLOCATOR_USE_BFC=true"
        if device.startswith("CPU")
        else "use TensorFlow's default GPU allocator"
    )
    raise AutoBatchError(
        f"--memory_budget is checked against the peak of TensorFlow's allocator on "
        f"{device}, which {found}; {fix} (a BFC allocator, which counts every tensor)."
    )


def _limit_text(budget):
    if budget is None:
        return "in the device's memory"
    return f"in memory_budget {budget / GB:g} GB"
