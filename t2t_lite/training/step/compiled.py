"""A replica body as the compiled train-step function the host calls: one trace
for every batch shape, and the micro-step counters moved on the way."""

import tensorflow as tf

from t2t_lite.graph import graph_function

_BATCH_SIGNATURE = (
    {
        "inputs": tf.TensorSpec([None, None], tf.int32),
        "targets": tf.TensorSpec([None, None], tf.int32),
    },
)


def compiled_step(body, strategy, counters, *, closes_window, advances=True):
    """`body` (a ReplicaStep method) run under `strategy` as one compiled function
    of a batch. One trace for all batch shapes: a [None, None] signature on one
    replica; distributed (PerReplica) batches get the same, built from the first
    batch (TracedOnce).

    With jit_compile, the replica's forward and backward pass (ReplicaStep.gradients)
    is an XLA-compiled function nested in this one; XLA compiles it once per batch
    shape it meets (pad batches to their bucket, data.pipeline's pad_to_bucket, to
    get one shape per bucket). Accumulation, the all-reduce and the optimizer stay
    outside XLA: tf.distribute's collectives cannot be compiled, and on a CPU an
    XLA-compiled update (dense Adam, scatter_add into the accumulators) measured
    slower than TF's kernels.
    """
    run = _counted(body, strategy, counters, closes_window, advances)
    if strategy.num_replicas_in_sync == 1:
        return graph_function(run, input_signature=_BATCH_SIGNATURE)
    return TracedOnce(run, strategy)


def _counted(body, strategy, counters, closes_window, advances):
    """Wraps a replica body: no cross-replica reduction of its outputs.

    The per-replica loss sums and token counts are returned as they are (a tuple
    of one tensor per local replica) and added on the host when a log line is
    written, and `global_step` and the window position move in cross-replica
    context, so nothing is communicated between replicas on a micro-step that
    is not an update. The counters move only once the body has finished (a call
    that fails part-way has not taken its micro-step), and not at all for a
    part of a split micro-batch (`advances` False).
    """

    def run(batch):
        outputs = strategy.run(body, args=(batch,))
        outputs = {
            k: tuple(strategy.experimental_local_results(v)) for k, v in outputs.items()
        }
        if advances:
            with tf.control_dependencies(tf.nest.flatten(outputs)):
                counters.global_step.assign_add(1)
                if closes_window:
                    counters.window_position.assign(0)
                else:
                    counters.window_position.assign_add(1)
        return outputs

    return run


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
