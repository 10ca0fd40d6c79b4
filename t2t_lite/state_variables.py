"""The variables that hold a run's state beside its weights: counters, a plan's
target, the loss scale, the learning rate's token clock, and the replica-local sums
of an accumulation window."""

import tensorflow as tf

# The packs `sums_over_replicas` all-reduces: a small model's sums travel in one, and
# a large model's save holds little beyond the sums themselves.
_BYTES_PER_PACK = 32 * 2**20


def first_replica_variable(value, dtype, name):
    """A non-trainable variable that is the same on every replica: written in
    cross-replica context or by the host between steps, so a distributed strategy
    keeps the first replica's value (ONLY_FIRST_REPLICA) and checkpoints carry one."""
    return tf.Variable(
        value,
        dtype=dtype,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def replica_sum_variable(value, name):
    """A non-trainable variable of each replica's own (ON_READ; a plain variable
    when not distributed), so that replicas never talk while adding into it. Read
    on the host it is the SUM over replicas; a checkpoint holds that sum, and a
    restore gives every replica an equal share of it."""
    return tf.Variable(
        value,
        trainable=False,
        name=name,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


def sums_over_replicas(variables, strategy):
    """Plain variables holding the sums over `strategy`'s replicas of
    replica_sum_variables, for a checkpoint to write in their place.

    TF's own checkpoint writer reads a replica-local variable three times per save,
    each read a reduction of its own: across hosts, a collective each (with a new
    thread pool each), several milliseconds apiece even on one machine. Here all
    of them go in packed all-reduces. Every worker must call it at the same point
    of the run, as it must save."""
    reduced = strategy.extended.batch_reduce_to(
        tf.distribute.ReduceOp.SUM,
        [(v, v) for v in variables],
        options=tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=_BYTES_PER_PACK
        ),
    )
    return [
        tf.Variable(strategy.experimental_local_results(r)[0], trainable=False)
        for r in reduced
    ]
