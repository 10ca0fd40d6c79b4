"""`graph_function`: the library's tf.function, without AutoGraph.

AutoGraph rewrites the source of every Python function a trace reaches (the Keras
layers included) so that Python `if`/`for` over tensors become graph control flow.
t2t_lite's compiled code needs none of that: its data-dependent control flow is
written as tf.cond and tf.while_loop. Without the rewriting, the first calls of
the train step take 0.73× their time for transformer_test and 0.87× for
transformer_base (docs/benchmarks.md, "Start-up"), in every process that trains.
"""

import tensorflow as tf


def graph_function(fn, **options):
    """tf.function(fn, autograph=False, **options)."""
    return tf.function(fn, autograph=False, **options)
