"""FactoredAdafactor (t2t_lite/optim/adafactor.py): Keras's Adafactor without a
matrix's full-size slot, resuming Keras's checkpoints."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.optim.adafactor import FactoredAdafactor

SHAPES = ((12, 8), (8,), (3, 10, 4))
RATE = 0.05


def _variables():
    rng = np.random.default_rng(0)
    return [
        tf.Variable(rng.standard_normal(s).astype(np.float32), name=f"w{i}")
        for i, s in enumerate(SHAPES)
    ]


def _gradients(updates, seed=1):
    rng = np.random.default_rng(seed)
    return [
        [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
        for _ in range(updates)
    ]


def _optimizer(optimizer_class, variables, rate=RATE, **options):
    optimizer = optimizer_class(
        learning_rate=rate, beta_2_decay=-0.8, clip_threshold=1.0, **options
    )
    optimizer.build(variables)
    return optimizer


def _train(optimizer_class, gradients, sparse=False, rate=RATE, **options):
    """Weights after one traced update per entry of `gradients`. sparse: the
    vector's gradient reaches the optimizer as IndexedSlices of all its rows."""
    variables = _variables()
    optimizer = _optimizer(optimizer_class, variables, rate, **options)

    @tf.function(autograph=False)
    def update(grads):
        if sparse:
            rows = tf.range(SHAPES[1][0])
            vector = tf.IndexedSlices(grads[1], rows, tf.constant(SHAPES[1]))
            grads = [grads[0], vector, grads[2]]
        optimizer.apply(grads, variables)

    for grads in gradients:
        update(grads)
    return [v.numpy() for v in variables], optimizer, update


def _assert_close(got, want):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("sparse", [False, True])
def test_updates_equal_keras_adafactor(sparse):
    gradients = _gradients(15)
    factored, _, _ = _train(FactoredAdafactor, gradients, sparse=sparse)
    reference, _, _ = _train(keras.optimizers.Adafactor, gradients)
    _assert_close(factored, reference)
    start = _variables()
    for moved, before in zip(factored, start):
        assert np.max(np.abs(moved - before.numpy())) > 1e-2  # every one moved


def _t2t_reference(gradients, rate):
    """The weights T2T's AdafactorOptimizer (given `rate`, no momentum) reaches, in
    float64 NumPy: decay 1 - t^-0.8, step rate x max(1e-3, RMS(w)), clipping at RMS
    1; a variable's last two dimensions factored."""

    def rms(x):
        return np.sqrt(np.mean(np.square(x)))

    weights = [v.numpy().astype(np.float64) for v in _variables()]
    moments = [None] * len(weights)
    for t, grads in enumerate(gradients, 1):
        decay = 1 - t**-0.8
        for i, (w, g) in enumerate(zip(weights, grads)):
            g = g.numpy().astype(np.float64)
            squared = g * g + 1e-30
            if w.ndim >= 2:
                rows, columns = moments[i] or (0.0, 0.0)
                rows = decay * rows + (1 - decay) * squared.mean(-1)
                columns = decay * columns + (1 - decay) * squared.mean(-2)
                moments[i] = rows, columns
                relative = rows / rows.mean(-1, keepdims=True)
                second = relative[..., None] * columns[..., None, :]
            else:
                previous = 0.0 if moments[i] is None else moments[i]
                second = moments[i] = decay * previous + (1 - decay) * squared
            update = g / np.sqrt(second)
            update /= max(1.0, rms(update))
            w -= rate * max(1e-3, rms(w)) * update
    return weights


def test_the_relative_step_caps_the_rate_unless_turned_off():
    """At a rate of 0.5 the cap 1/sqrt(t) binds from update 5 on: capped, the
    updates are Keras's; uncapped, T2T's, and the two differ."""
    gradients = _gradients(15)
    capped, _, _ = _train(FactoredAdafactor, gradients, rate=0.5)
    keras_capped, _, _ = _train(keras.optimizers.Adafactor, gradients, rate=0.5)
    _assert_close(capped, keras_capped)
    uncapped, optimizer, _ = _train(
        FactoredAdafactor, gradients, rate=0.5, relative_step=False
    )
    reference = _t2t_reference(gradients, 0.5)
    for got, want in zip(uncapped, reference):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert max(np.max(np.abs(a - b)) for a, b in zip(capped, uncapped)) > 0.1
    assert optimizer.get_config()["relative_step"] is False


def test_a_matrix_keeps_only_its_row_and_column_means():
    variables = _variables()
    slots = {tuple(v.shape) for v in _optimizer(FactoredAdafactor, variables).variables}
    keras_slots = {
        tuple(v.shape)
        for v in _optimizer(keras.optimizers.Adafactor, variables).variables
    }
    # rows and columns of (12, 8) and of (3, 10, 4), the vector's own slot, the count
    assert slots == {(12,), (8,), (3, 10), (3, 4), ()}
    assert {(12, 8), (3, 10, 4)} <= keras_slots  # Keras's full-size slots


def test_scalars_are_built_once_per_apply():
    _, _, update = _train(FactoredAdafactor, _gradients(1))
    graph = update.get_concrete_function(
        [tf.TensorSpec(s, tf.float32) for s in SHAPES]
    ).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("Pow") == 1  # the decay 1 - t^-0.8, for all three variables


def _keras_run(tmp_path):
    """Keras's Adafactor over 6 updates: (their gradients, the checkpoint written
    after 3, the weights after 6)."""
    gradients = _gradients(6)
    variables = _variables()
    keras_optimizer = _optimizer(keras.optimizers.Adafactor, variables)
    for grads in gradients[:3]:
        keras_optimizer.apply(grads, variables)
    written = tf.train.Checkpoint(w=variables, optimizer=keras_optimizer).write(
        str(tmp_path / "keras")
    )
    for grads in gradients[3:]:
        keras_optimizer.apply(grads, variables)
    return gradients, written, variables


def test_a_keras_adafactor_checkpoint_resumes_exactly(tmp_path):
    """A run checkpointed with Keras's Adafactor goes on here as it would have
    there; this class's own checkpoints hold no full-size slot and resume too."""
    gradients, written, variables = _keras_run(tmp_path)

    resumed = _variables()
    optimizer = _optimizer(FactoredAdafactor, resumed)
    restore = tf.train.Checkpoint(w=resumed, optimizer=optimizer).read(written)
    restore.assert_existing_objects_matched()
    assert int(optimizer.iterations) == 3
    for grads in gradients[3:]:
        optimizer.apply(grads, resumed)
    _assert_close([v.numpy() for v in resumed], [v.numpy() for v in variables])

    own = tf.train.Checkpoint(w=resumed, optimizer=optimizer).write(
        str(tmp_path / "own")
    )
    saved = [tuple(shape) for _, shape in tf.train.list_variables(own)]
    assert saved.count((12, 8)) == saved.count((3, 10, 4)) == 1  # the weights only
    assert set(saved) == {(), (12, 8), (8,), (3, 10, 4), (12,), (3, 10), (3, 4)}
    # Keras's names and dtypes: restoring Keras's checkpoint reads every value
    # (TensorFlow warns of each one a restore leaves unread).
    dtypes = [
        tf.train.load_checkpoint(path).get_variable_to_dtype_map()
        for path in (written, own)
    ]
    assert dtypes[0] == dtypes[1]
    again = _variables()
    optimizer_again = _optimizer(FactoredAdafactor, again)
    restore = tf.train.Checkpoint(w=again, optimizer=optimizer_again).read(own)
    restore.assert_existing_objects_matched()
    for a, b in zip(optimizer.variables, optimizer_again.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_checkpoint_restored_before_build_waits_for_the_slots(tmp_path):
    """Restored into an optimizer not built yet, a checkpoint's slots wait for
    build (Keras's own list, whose places differ, never sees them)."""
    gradients, written, variables = _keras_run(tmp_path)

    resumed = _variables()
    optimizer = FactoredAdafactor(
        learning_rate=RATE, beta_2_decay=-0.8, clip_threshold=1.0
    )
    tf.train.Checkpoint(w=resumed, optimizer=optimizer).read(written)
    optimizer.build(resumed)
    assert float(tf.reduce_sum(optimizer._r[0])) > 0  # restored, not zeros
    for grads in gradients[3:]:
        optimizer.apply(grads, resumed)
    _assert_close([v.numpy() for v in resumed], [v.numpy() for v in variables])
