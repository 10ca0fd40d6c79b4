"""`without_autotuning`: the library's tf.data datasets, minus autotuning's thread.

tf.data's autotuning, on by default, gives every iterator a thread that re-tunes the
pipeline on a timer whose period doubles up to a minute. Deleting the iterator
cancels that thread and waits for it to end, holding the GIL. In TF 2.21 the
cancellation can be missed: its callback wakes the thread before the iterator's
cancellation manager reads as cancelled, so the thread sleeps out the rest of its
period, and the whole process stands still until it does (up to a minute). The woken
thread wins that race when it gets a core at once, which is when the other cores are
busy: scripts/bench_teardown.py measures it (docs/benchmarks.md, "Iterator
teardown"). The trainer deletes an iterator after every evaluation and when a run
ends; a process that builds many runs (a sweep, the test suite) deletes many.

Without autotuning, `num_parallel_calls=tf.data.AUTOTUNE` stays at tf.data's starting
parallelism (the inter-op thread pool's size, at most 16), and
`prefetch(tf.data.AUTOTUNE)` keeps its own buffer tuner, which needs no thread. The
same benchmark compares the training pipeline's throughput with and without.
"""

import tensorflow as tf


def without_autotuning(dataset):
    """`dataset` with tf.data's autotuning off (see the module docstring)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
