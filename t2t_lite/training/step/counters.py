"""The train step's counters: what it has done, checkpointed so a run resumes
exactly, and two flags each process keeps for itself."""

import tensorflow as tf

from t2t_lite.state_variables import first_replica_variable


class StepCounters:
    """Variables the compiled step writes and the host loop reads."""

    def __init__(self, strategy):
        with strategy.scope():
            # Micro-batches consumed (T2T's global_step, docs/design.md §2.1).
            self.global_step = _counter("global_step")
            # Divergence guard: updates skipped because the window's loss or gradient
            # was NaN/Inf, in a row (reset by a good update) and in total.
            self.bad_updates_in_a_row = _counter("bad_updates_in_a_row")
            self.skipped_updates = _counter("skipped_updates")
            # Applied updates whose gradient norm exceeded clip_grad_norm (> 0).
            self.clipped_updates = _counter("clipped_updates")
            # The current window: its size (0 = not recorded, a checkpoint from
            # before windows could vary: then size n and position global_step mod n)
            # and the micro-batches of it consumed.
            self.window_size = _counter("window_size")
            self.window_position = _counter("window_position")
            self.tokens_seen = _counter("tokens_seen")  # non-pad target tokens
            # Micro-batches (or parts of one) split because they ran out of memory.
            self.oom_splits = _counter("oom_splits")
        # This process's vote to stop, summed over all replicas by the update's
        # all-reduce. A plain local variable: each worker sets its own.
        self.stop_vote = tf.Variable(0.0, trainable=False, name="stop_vote")
        # Replicas inside the optimizer's apply right now: non-zero after a call
        # that failed there, when the weights may be partly updated.
        self.applying = tf.Variable(0, trainable=False, name="applying")


def _counter(name):
    return first_replica_variable(0, tf.int64, name)
