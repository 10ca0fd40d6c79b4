"""FusedAdam and FusedSGD (t2t_lite/optim/fused.py): Keras's update rules, one
TensorFlow kernel per variable."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.optim.fused import FusedAdam, FusedSGD

SHAPES = ((12, 8), (8,), (30, 4))

# (fused class, Keras class, keyword arguments, the kernel each variable gets)
RULES = {
    "adam": (FusedAdam, keras.optimizers.Adam, {"beta_2": 0.98}, "ResourceApplyAdam"),
    "sgd": (FusedSGD, keras.optimizers.SGD, {}, "ResourceApplyGradientDescent"),
    "momentum": (
        FusedSGD,
        keras.optimizers.SGD,
        {"momentum": 0.9},
        "ResourceApplyKerasMomentum",
    ),
    "nesterov": (
        FusedSGD,
        keras.optimizers.SGD,
        {"momentum": 0.9, "nesterov": True},
        "ResourceApplyKerasMomentum",
    ),
}


def _train(optimizer_class, options, updates=15, sparse=False, densify=False):
    """Weights and slots after `updates` updates from the same start, with a
    learning rate that changes every update (as a schedule's does), and the
    update's tf.function. sparse: the last variable's gradient is an embedding
    lookup's (IndexedSlices); densify: made a dense tensor before the optimizer
    sees it."""
    rng = np.random.default_rng(0)
    variables = [tf.Variable(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
    rate = tf.Variable(0.01)
    optimizer = optimizer_class(learning_rate=lambda: rate.read_value(), **options)
    optimizer.build(variables)

    @tf.function(autograph=False)
    def update(gradients):
        if sparse:
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
    slots = [v.numpy() for v in optimizer.variables if len(v.shape) > 0]
    return [v.numpy() for v in variables] + slots, update


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_fused_updates_equal_keras_on_dense_gradients(rule, sparse):
    """An IndexedSlices gradient counts as its dense form (every row's slots
    decay), as the train step hands it over (training/step/replica_step.py);
    Keras's optimizers would update only the rows it names."""
    fused_class, keras_class, options, _ = RULES[rule]
    fused, _ = _train(fused_class, options, sparse=sparse)
    reference, _ = _train(keras_class, options, sparse=sparse, densify=True)
    assert len(fused) == len(reference)
    for a, b in zip(fused, reference):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    start = np.random.default_rng(0).standard_normal(SHAPES[0])
    assert np.max(np.abs(fused[0] - start)) > 1e-3  # it did move


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_variable_is_updated_by_one_kernel(rule):
    fused_class, _, options, kernel = RULES[rule]
    _, update = _train(fused_class, options, updates=1)
    graph = update.get_concrete_function(
        [tf.TensorSpec(s, tf.float32) for s in SHAPES]
    ).graph
    assert [op.type for op in graph.get_operations()].count(kernel) == len(SHAPES)


def test_adams_scalars_are_built_once_per_apply():
    """Keras calls update_step once per variable; the betas, their powers and ε
    are the same for all, so one apply builds them once (2 powers, not 2 per
    variable), in the apply's own graph: a second apply reads the new count."""
    _, update = _train(FusedAdam, {}, updates=1)
    graph = update.get_concrete_function(
        [tf.TensorSpec(s, tf.float32) for s in SHAPES]
    ).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("Pow") == 2 and types.count("ResourceApplyAdam") == len(SHAPES)

    results = []
    for optimizer_class in (FusedAdam, keras.optimizers.Adam):
        variables = [tf.Variable(tf.ones(s)) for s in SHAPES]
        optimizer = optimizer_class(learning_rate=0.1)
        optimizer.build(variables)
        gradients = [tf.fill(s, 0.5) for s in SHAPES]

        @tf.function(autograph=False)
        def two_applies(optimizer=optimizer, variables=variables, gradients=gradients):
            optimizer.apply(gradients, variables)
            optimizer.apply(gradients, variables)

        two_applies()
        results.append([v.numpy() for v in variables])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
