"""t2t_lite/graph.py: the library compiles without AutoGraph, everywhere, and a
finished trace leaves nothing of its graph behind."""

import gc
import pathlib
import weakref

import pytest
import tensorflow as tf
from tensorflow.python.framework import ops

from t2t_lite import registrations  # noqa: F401  (registers the transformer)
from t2t_lite.graph import graph_function
from t2t_lite.models.factory import build_model
from t2t_lite.registry import HPARAMS_SETS, MODELS

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "t2t_lite"


def test_graph_function_does_not_rewrite_python_control_flow():
    def sign(x):
        if x > 0:  # AutoGraph would turn this into a tf.cond
            return x
        return -x

    spec = [tf.TensorSpec([], tf.float32)]
    assert float(tf.function(sign, input_signature=spec)(tf.constant(-2.0))) == 2.0
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        graph_function(sign, input_signature=spec)(tf.constant(-2.0))


def test_the_library_compiles_only_through_graph_function():
    """A new tf.function elsewhere in t2t_lite would bring AutoGraph's cost back
    (docs/benchmarks.md, "Start-up")."""
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "graph.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "tf.function(" in line or "@tf.function" in line
    ]
    assert offenders == []


@tf.custom_gradient
def _doubled(x):
    return 2.0 * x, lambda upstream: 2.0 * upstream


def _gradient_of_doubled(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = _doubled(x)
    return tape.gradient(y, x)


def _graph_after_deleting(compile_function):
    """A weak reference to the graph of `compile_function(_gradient_of_doubled)`,
    once that function is gone."""
    function = compile_function(_gradient_of_doubled)
    assert float(function(tf.constant(1.0))) == 2.0  # the custom gradient, in a trace
    graph = weakref.ref(function.get_concrete_function(tf.constant(1.0)).graph)
    del function
    gc.collect()
    return graph


def test_a_finished_trace_leaves_no_graph_alive():
    """tf.custom_gradient registers each traced call's gradient process-wide, which
    keeps the graph alive; graph_function unregisters them once the trace is done.
    The control: a plain tf.function's graph outlives it."""
    assert _graph_after_deleting(graph_function)() is None
    assert _graph_after_deleting(tf.function)() is not None


def _custom_gradient_count():
    return sum(
        str(name).startswith("CustomGradient-")
        for name in ops._gradient_registry.list()
    )


def test_building_a_model_registers_no_gradient_for_good():
    """Keras builds layers by tracing them; the Transformer's layer norms and
    dropout have custom gradients (models/kernels.py)."""
    before = _custom_gradient_count()
    hp = HPARAMS_SETS.get("transformer_test")()
    build_model(MODELS.get("transformer"), hp, vocab_size=20)
    assert _custom_gradient_count() == before
