"""The variables that hold a run's state beside its weights: counters, a plan's
target, the loss scale, the learning rate's token clock."""

import tensorflow as tf


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
