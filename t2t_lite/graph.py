"""`graph_function`: the library's tf.function, without AutoGraph, and without the
graphs that tf.custom_gradient would keep alive for the rest of the process.

AutoGraph rewrites the source of every Python function a trace reaches (the Keras
layers included) so that Python `if`/`for` over tensors become graph control flow.
t2t_lite's compiled code needs none of that: its data-dependent control flow is
written as tf.cond and tf.while_loop. Without the rewriting, the first calls of
the train step take 0.73× their time for transformer_test and 0.87× for
transformer_base (docs/benchmarks.md, "Start-up"), in every process that trains.

Inside a trace, every call of a tf.custom_gradient function (the hand-written
gradients of models/kernels.py and models/recompute.py) registers its gradient in
TensorFlow's process-wide gradient registry under a new name, and never removes
it. The registered closure holds tensors of the graph being traced, so every
traced graph (train step, evaluation, beam search) stayed alive until the process
ended, however many Trainers had come and gone (~39,000 objects and ~35 MB per
transformer_test Trainer, docs/benchmarks.md "Graphs left alive"). The
gradients are taken inside the same trace (the train step differentiates itself),
so once the outermost trace has finished nothing needs those names: they are
removed then. A SavedModel exported afterwards carries no gradient functions for
them (TensorFlow skips a gradient it cannot look up), which serving does not use.
"""

import contextlib
import threading

import tensorflow as tf

# TensorFlow's gradient registry (a name → gradient function map) and the prefix of
# the names tf.custom_gradient generates. Private to TensorFlow, so both are checked
# for: should either change, traces keep their graphs alive as before, nothing fails.
from tensorflow.python.framework import ops as _tf_ops

_CUSTOM_GRADIENT_PREFIX = "CustomGradient-"

_traces = {"active": 0, "registered_before": frozenset()}
_traces_lock = threading.Lock()


def graph_function(fn, **options):
    """tf.function(fn, autograph=False, **options), whose traces release their
    custom-gradient registrations when done."""
    return tf.function(releasing_custom_gradients()(fn), autograph=False, **options)


@contextlib.contextmanager
def releasing_custom_gradients():
    """Unregisters, when the last of these blocks in progress ends, the custom
    gradients registered since the first began. They nest (the XLA gradients'
    trace inside the train step's) and tf.distribute traces replicas in threads
    meanwhile, so the count is process-wide. Also a decorator, and for code that
    traces outside a graph_function: Keras builds a layer by calling it in a
    scratch graph."""
    with _traces_lock:
        if _traces["active"] == 0:
            _traces["registered_before"] = _custom_gradient_names()
        _traces["active"] += 1
    try:
        yield
    finally:
        with _traces_lock:
            _traces["active"] -= 1
            if _traces["active"] == 0:
                registry = _registry()
                for name in _custom_gradient_names() - _traces["registered_before"]:
                    registry.pop(name, None)


def _registry():
    registry = getattr(getattr(_tf_ops, "_gradient_registry", None), "_registry", None)
    return registry if isinstance(registry, dict) else {}


def _custom_gradient_names():
    return frozenset(
        name for name in _registry() if str(name).startswith(_CUSTOM_GRADIENT_PREFIX)
    )
