"""One trace of a distributed train-step function for every batch shape."""

import tensorflow as tf

from t2t_lite.graph import graph_function


class TracedOnce:
    """A tf.function over distributed batches, traced once for every batch shape.

    A PerReplica batch cannot be described by a plain TensorSpec, so the signature
    is made from the first batch: its type spec with every dimension unknown. Without
    it, each new bucket shape would retrace the step (seconds each) until
    tf.function's own relaxation caught up.
    """

    def __init__(self, fn, strategy):
        self._fn, self._strategy, self._function = fn, strategy, None

    def _compiled(self, batch):
        if self._function is None:
            spec = tf.nest.map_structure(self._relaxed_spec, batch)
            self._function = graph_function(self._fn, input_signature=[spec])
        return self._function

    def _relaxed_spec(self, value):
        if isinstance(value, tf.Tensor):  # one local replica: a plain tensor
            return tf.TensorSpec([None] * value.shape.rank, value.dtype)
        local = self._strategy.experimental_local_results(value)
        relaxed = [tf.TensorSpec([None] * t.shape.rank, t.dtype) for t in local]
        return type(tf.type_spec_from_value(value))(*relaxed)

    def __call__(self, batch):
        return self._compiled(batch)(batch)

    def get_concrete_function(self, batch):
        return self._compiled(batch).get_concrete_function(batch)

    def experimental_get_tracing_count(self):
        return self._function.experimental_get_tracing_count() if self._function else 0
