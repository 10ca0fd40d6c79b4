"""t2t_lite/graph.py: the library compiles without AutoGraph, everywhere."""

import pathlib

import pytest
import tensorflow as tf

from t2t_lite.graph import graph_function

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
