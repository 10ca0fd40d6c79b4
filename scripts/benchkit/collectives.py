"""A cross-device reduction that counts what it is handed, for bench_distributed.py:
the all-reduces a compiled train step traced (docs/design.md §2.5: one per update,
none on accumulate micro-steps)."""

import tensorflow as tf


class CountingReduction(tf.distribute.ReductionToOneDevice):
    """ReductionToOneDevice that counts the reductions handed to it: `groups` (one
    per reduce or batch_reduce call, however many tensors it carries) and `tensors`.
    Counts at trace time: a compiled step runs what it traced, once per call."""

    def __init__(self):
        super().__init__()
        self.groups = self.tensors = 0

    def reduce(self, reduce_op, per_replica_value, destinations, options=None):
        self.groups += 1
        self.tensors += 1
        return super().reduce(reduce_op, per_replica_value, destinations, options)

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        self.groups += 1
        self.tensors += len(value_destination_pairs)
        return super().batch_reduce(reduce_op, value_destination_pairs, options)


def traced_collectives(step, batch, counter):
    """{compiled function: (all-reduce groups, tensors)} that tracing a TrainStep's
    two compiled functions on `batch` hands to `counter` (its strategy's
    CountingReduction)."""
    counts = {}
    for name in ("accumulate", "accumulate_and_update"):
        counter.groups = counter.tensors = 0
        getattr(step, name).get_concrete_function(batch)
        counts[name] = (counter.groups, counter.tensors)
    return counts
