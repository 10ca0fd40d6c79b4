"""FusedAdam (t2t_lite/optim/fused_adam.py): Keras's Adam, one kernel per variable."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.optim.fused_adam import FusedAdam

SHAPES = ((12, 8), (8,), (30, 4))


def _train(optimizer_class, updates=15, sparse=False, densify=False):
    """Weights and moments after `updates` updates from the same start, with a
    learning rate that changes every update (as a schedule's does). sparse: the
    last variable's gradient is an embedding lookup's (IndexedSlices); densify:
    made a dense tensor before the optimizer sees it."""
    rng = np.random.default_rng(0)
    variables = [tf.Variable(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
    rate = tf.Variable(0.01)
    optimizer = optimizer_class(
        learning_rate=lambda: rate.read_value(), beta_1=0.9, beta_2=0.98, epsilon=1e-9
    )
    optimizer.build(variables)

    @tf.function(autograph=False)
    def update(gradients):
        if sparse:  # the last variable's gradient as an embedding lookup's
            table = variables[-1]
            with tf.GradientTape() as tape:
                rows = tf.gather(table, [0, 3, 3, 7])
                loss = tf.reduce_sum(rows * gradients[-1][:4])
            rows_gradient = tape.gradient(loss, table)
            assert isinstance(rows_gradient, tf.IndexedSlices)
            if densify:
                rows_gradient = tf.convert_to_tensor(rows_gradient)
            gradients = [*gradients[:-1], rows_gradient]
        optimizer.apply(gradients, variables)

    for i in range(updates):
        rate.assign(0.01 / (1 + i))
        update([tf.constant(rng.standard_normal(s).astype(np.float32)) for s in SHAPES])
    moments = [v.numpy() for v in optimizer._momentums + optimizer._velocities]
    return [v.numpy() for v in variables], moments, update


@pytest.mark.parametrize("sparse", [False, True])
def test_fused_adam_updates_as_keras_adam_does_on_dense_gradients(sparse):
    """An IndexedSlices gradient counts as its dense form (every row's moments
    decay), as the train step hands it over (training/step/replica_step.py);
    Keras's Adam would decay only the rows it names."""
    fused_weights, fused_moments, _ = _train(FusedAdam, sparse=sparse)
    keras_weights, keras_moments, _ = _train(
        keras.optimizers.Adam, sparse=sparse, densify=True
    )
    for fused, reference in zip(
        fused_weights + fused_moments, keras_weights + keras_moments
    ):
        np.testing.assert_allclose(fused, reference, rtol=2e-5, atol=1e-6)
    start = np.random.default_rng(0).standard_normal(SHAPES[0])
    assert np.max(np.abs(fused_weights[0] - start)) > 1e-3  # it did move


def test_each_variable_is_updated_by_one_kernel():
    *_, update = _train(FusedAdam, updates=1)
    graph = update.get_concrete_function(
        [tf.TensorSpec(s, tf.float32) for s in SHAPES]
    ).graph
    kernels = [op for op in graph.get_operations() if op.type == "ResourceApplyAdam"]
    assert len(kernels) == len(SHAPES)
