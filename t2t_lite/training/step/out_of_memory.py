"""Surviving a micro-batch that does not fit in memory (docs/design.md §2.7).

A micro-batch whose step raises `ResourceExhaustedError` is split by sentences into
two halves, which are accumulated in its place; a half that does not fit either is
split again. Since the update is normalized by tokens, the update made of the halves
is the one the whole micro-batch would have given (to float rounding), and the run's
counters see one micro-batch, as they would have: the halves but the last take no
micro-step (`TrainStep.accumulate_part`).

Replicas: in one process (MirroredStrategy) every replica's share is halved alike,
so all replicas take the same calls; a replica holding a single sentence gives it to
the second half and an empty batch to the first. Across hosts only the update
micro-step communicates; a split adds calls that do not, so workers still meet in
the same all-reduce however many parts each took. The accumulators the parts add
into exist on every worker from the start, even with a fixed n of 1: creating a
variable there is itself a collective, which one worker cannot make alone.

A failed call leaves the run's state as it was: `TrainStep` makes every write wait
for the forward and backward pass of every local replica, and what the update writes
besides the weights (counters, tokens seen, the noise scale, the accumulator reset)
for the optimizer's apply. The dropout generators may have drawn: the retried halves
draw other masks, as halves would anyway. Running out of memory inside the apply
itself, where the weights may be partly updated, stops the run with one line
(`StepOutOfMemory`) instead.

A single sentence that does not fit is `MicroBatchTooLarge`: one line naming its
length, raised before anything more is written, so the last checkpoint stands.

`SimulatedMemory` lets tests and benchmarks put a limit on a CPU, where TensorFlow
would rather swap than fail: a micro-batch above `max_tokens` (padding included)
raises the error a device would.
"""

import numpy as np
import tensorflow as tf

from t2t_lite.constants import PAD_ID
from t2t_lite.errors import UserError
from t2t_lite.training.cluster.distribution import num_workers, worker_index


class MicroBatchTooLarge(UserError):
    """One sentence pair whose step does not fit in the device's memory."""


class StepOutOfMemory(UserError):
    """Out of memory where a split cannot help (inside the optimizer's update)."""


def padded_tokens(batch, strategy):
    """The largest padded size, sentences × (source + target length), of any local
    replica's share of `batch`: what one replica's step holds in memory."""
    return max(
        _rows(share) * (_width(share["inputs"]) + _width(share["targets"]))
        for share in local_shares(batch, strategy)
    )


def local_shares(batch, strategy):
    """Each local replica's share of `batch`, as a plain dict of tensors."""
    if strategy.num_replicas_in_sync == 1:
        return [batch]
    columns = {
        key: strategy.experimental_local_results(value) for key, value in batch.items()
    }
    count = len(next(iter(columns.values())))
    return [{key: values[i] for key, values in columns.items()} for i in range(count)]


def halves(batch, strategy, error):
    """(first, second): `batch` split by sentences, every replica's share halved
    and each half cut to its longest sentence. Raises MicroBatchTooLarge when no
    share holds two sentences."""
    shares = local_shares(batch, strategy)
    if max(_rows(share) for share in shares) < 2:
        widest = max(shares, key=lambda s: _width(s["inputs"]) + _width(s["targets"]))
        raise MicroBatchTooLarge(
            "a single sentence pair does not fit in memory: source "
            f"{_width(widest['inputs'])} tokens, target {_width(widest['targets'])} "
            f"tokens ({_why(error)}); lower max_length (hparam) to leave such "
            "pairs out, or use recompute_grad=true or a smaller model"
        )
    firsts, seconds = [], []
    for share in shares:
        middle = _rows(share) // 2
        firsts.append(_trimmed({k: v[:middle] for k, v in share.items()}))
        seconds.append(_trimmed({k: v[middle:] for k, v in share.items()}))
    return _as_batch(firsts, strategy), _as_batch(seconds, strategy)


def in_the_update(error, step):
    """The error for running out of memory inside the optimizer's apply, after
    which the weights may be partly updated: no split can repair that."""
    return StepOutOfMemory(
        f"out of memory inside the optimizer's update at step {step} "
        f"({_why(error)}): the weights may be partly updated, so the run stops "
        "here; resume from the last checkpoint with a smaller batch_size, "
        "recompute_grad=true or more memory"
    )


def merged(first, second):
    """The outputs of a split micro-batch: per-replica loss sums and token counts
    added, everything else (the window's, on an update) from the last part."""
    out = dict(second)
    for key in ("loss_sum", "tokens"):
        out[key] = tuple(a + b for a, b in zip(first[key], second[key]))
    return out


class SimulatedMemory:
    """A memory limit for CPUs (tests, benchmarks): `check(batch)` raises
    ResourceExhaustedError when a replica's share holds more than `max_tokens`
    padded tokens, as a device's allocator would. `calls` counts the checks and
    `refused` the micro-batches it refused."""

    def __init__(self, max_tokens):
        self.max_tokens = max_tokens
        self.calls = self.refused = 0

    def check(self, batch, strategy):
        self.calls += 1
        size = padded_tokens(batch, strategy)
        if size > self.max_tokens:
            self.refused += 1
            raise tf.errors.ResourceExhaustedError(
                None,
                None,
                f"OOM when allocating the step of {size} padded tokens "
                f"(simulated memory of {self.max_tokens} tokens)",
            )


def _rows(share):
    return int(share["inputs"].shape[0])


def _width(tensor):
    return int(tensor.shape[1])


def _trimmed(share):
    """Drops the columns that are padding in every sentence of the share (the half
    may hold only shorter sentences than the whole), keeping at least one."""
    out = {}
    for key, value in share.items():
        used = np.flatnonzero(np.any(value.numpy() != PAD_ID, axis=0))
        width = max(int(used[-1]) + 1 if used.size else 1, 1)
        out[key] = value[:, :width]
    return out


def _as_batch(shares, strategy):
    """The shares as the step takes a batch: a plain dict on one replica,
    distributed values otherwise (replica ids counted from this worker's first)."""
    if strategy.num_replicas_in_sync == 1:
        return shares[0]
    first_id = worker_index(strategy) * (
        strategy.num_replicas_in_sync // num_workers(strategy)
    )
    return strategy.experimental_distribute_values_from_function(
        lambda context: shares[context.replica_id_in_sync_group - first_id]
    )


def _why(error):
    message = str(getattr(error, "message", error)).strip().splitlines()
    return message[0] if message else "out of memory"
