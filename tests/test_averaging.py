"""Checkpoint averaging: exact on identical checkpoints, the elementwise mean on
differing ones, restorable into the model alone and into the full training checkpoint,
and t2t-avg-all's one-line errors."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.cli_helpers import assert_user_error, run_cli

from t2t_lite.errors import UserError
from t2t_lite.models.config import TransformerConfig
from t2t_lite.models.transformer import Transformer
from t2t_lite.outputs import averaging

_FEATURES = {"inputs": tf.ones([1, 3], tf.int32), "targets": tf.ones([1, 3], tf.int32)}


def _model():
    model = Transformer(
        TransformerConfig(
            vocab_size=20,
            hidden_size=16,
            filter_size=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            num_heads=2,
            layer_prepostprocess_dropout=0.0,
            attention_dropout=0.0,
            relu_dropout=0.0,
            shared_embedding_and_softmax_weights=True,
        )
    )
    model(_FEATURES)  # build
    return model


def _training_objects(model):
    """What the trainer's checkpoint holds (minus the accumulator): an optimizer with
    slots, the step counter, the RNG states and the input iterator.

    The model's weights are reachable both under model/ and through
    optimizer/_trainable_variables; which key names a weight depends on the object
    graph, which is why the average keeps the newest checkpoint's graph unchanged.
    """
    optimizer = keras.optimizers.Adam()
    optimizer.apply_gradients([(tf.ones_like(v), v) for v in model.trainable_variables])
    return {
        "model": model,
        "optimizer": optimizer,
        "global_step": tf.Variable(0, dtype=tf.int64),
        "model_state": list(model.non_trainable_variables),
        # The input position, a DT_VARIANT tensor with no numpy form.
        "train_iterator": iter(tf.data.Dataset.range(100)),
    }


def _write_run(directory, weights_by_step):
    """A run dir with one training checkpoint per {step: trainable weights}."""
    objects = _training_objects(_model())
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(**objects),
        str(directory),
        max_to_keep=10,
        checkpoint_name="model",
    )
    for step, weights in sorted(weights_by_step.items()):
        for variable, value in zip(objects["model"].trainable_variables, weights):
            variable.assign(value)
        objects["global_step"].assign(step)
        next(objects["train_iterator"])  # one element per checkpoint
        manager.save(checkpoint_number=step)
    (directory / "hparams.json").write_text('{"hidden_size": 16}\n')
    (directory / "run.json").write_text('{"model": "transformer"}\n')


def _weights(seed, like):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=v.shape).astype(v.dtype) for v in like.trainable_variables]


def _restored(path):
    """(trainable weights, global_step, optimizer iterations, next input element)
    restored from `path` into the full training objects, which must match it exactly."""
    objects = _training_objects(_model())
    objects["optimizer"].iterations.assign(0)
    tf.train.Checkpoint(**objects).restore(path).assert_consumed()
    weights = [v.numpy() for v in objects["model"].trainable_variables]
    return (
        weights,
        int(objects["global_step"]),
        int(objects["optimizer"].iterations),
        int(next(objects["train_iterator"])),
    )


def _assert_mean(got, *weight_lists):
    for i, value in enumerate(got):
        mean = sum(w[i].astype(np.float64) for w in weight_lists) / len(weight_lists)
        np.testing.assert_allclose(value, mean, rtol=1e-7)


@pytest.fixture(scope="module")
def reference():
    return _model()


def test_identical_checkpoints_average_to_themselves_bitwise(tmp_path, reference):
    weights = _weights(0, reference)
    _write_run(tmp_path / "run", {2: weights, 4: weights, 6: weights})
    path = averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 3)
    assert path == os.path.join(tmp_path / "avg", "model-6")
    got, step, _, _ = _restored(path)
    assert step == 6
    for value, want in zip(got, weights, strict=True):
        assert value.tobytes() == want.tobytes()
    for name in ("hparams.json", "run.json"):
        assert (tmp_path / "avg" / name).read_text() == (
            tmp_path / "run" / name
        ).read_text()
    assert tf.train.latest_checkpoint(str(tmp_path / "avg")) == path


def test_two_checkpoints_average_to_their_mean_and_newest_step(tmp_path, reference):
    a, b = _weights(1, reference), _weights(2, reference)
    _write_run(tmp_path / "run", {10: a, 20: b})
    path = averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 2)
    got, step, iterations, next_element = _restored(path)
    _assert_mean(got, a, b)
    # Copied from the newest: integers, and the iterator (after 2 elements).
    assert (step, iterations, next_element) == (20, 1, 2)


def test_only_the_newest_num_last_are_averaged(tmp_path, reference):
    old, new, newer = (_weights(i, reference) for i in (3, 4, 5))
    _write_run(tmp_path / "run", {1: old, 2: old, 30: new, 400: newer})
    path = averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 2)
    assert path.endswith("model-400")  # sorted by step, not by name
    _assert_mean(_restored(path)[0], new, newer)


def test_model_only_restore_matches_the_newest_checkpoint(tmp_path, reference):
    """What a decoder does: tf.train.Checkpoint(model=m).restore(p).expect_partial().
    The average of identical checkpoints restores bitwise like the newest one."""
    weights = _weights(6, reference)
    _write_run(tmp_path / "run", {1: weights, 2: weights})
    path = averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 2)

    def model_only(prefix):
        keras.utils.set_random_seed(0)  # the same init for anything not restored
        model = _model()
        tf.train.Checkpoint(model=model).restore(prefix).expect_partial()
        return model.get_weights()

    newest = model_only(str(tmp_path / "run" / "model-2"))
    for value, want in zip(model_only(path), newest, strict=True):
        assert value.tobytes() == want.tobytes()


def test_refusals_are_user_errors(tmp_path, reference):
    _write_run(tmp_path / "run", {1: _weights(7, reference)})
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no model-N\.index"):
        averaging.average_checkpoints(tmp_path / "empty", tmp_path / "avg", 1)
    with pytest.raises(UserError, match="is model_dir"):
        averaging.average_checkpoints(tmp_path / "run", tmp_path / "run", 1)
    with pytest.raises(UserError, match="n must be >= 1"):
        averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 0)
    averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 1)
    with pytest.raises(UserError, match="overwrite"):
        averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 1)
    averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 1, overwrite=True)
    assert sorted(os.listdir(tmp_path / "avg")) == [
        "checkpoint",
        "hparams.json",
        "model-1.data-00000-of-00001",
        "model-1.index",
        "run.json",
    ]


def test_checkpoints_of_different_models_are_refused(tmp_path, reference):
    _write_run(tmp_path / "run", {1: _weights(8, reference)})
    other = tf.train.Checkpoint(
        model=keras.layers.Dense(3), global_step=tf.Variable(2, dtype=tf.int64)
    )
    other.model(tf.ones([1, 2]))
    other.write(str(tmp_path / "run" / "model-2"))
    with pytest.raises(UserError, match=r"model-1 and .*model-2"):
        averaging.average_checkpoints(tmp_path / "run", tmp_path / "avg", 2)
    assert not (tmp_path / "avg").exists()


# --- t2t-avg-all as a user runs it ----------------------------------------------------


def test_cli(tmp_path, reference):
    run, avg = tmp_path / "run", tmp_path / "avg"
    _write_run(run, {5: _weights(9, reference), 9: _weights(10, reference)})
    (tmp_path / "empty").mkdir()
    ok = run_cli(
        "avg_checkpoints", f"--model_dir={run}", f"--output_dir={avg}", "--n=2"
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"steps 5, 9) into {avg / 'model-9'}" in ok.stdout
    bad = [
        ([f"--model_dir={tmp_path / 'empty'}", f"--output_dir={avg}2"], "no model-N"),
        ([f"--model_dir={run}", f"--output_dir={run}"], "model_dir"),
        ([f"--model_dir={run}", f"--output_dir={avg}3", "--n=0"], "n must be >= 1"),
        ([f"--model_dir={run}", f"--output_dir={avg}"], "overwrite"),
        ([f"--output_dir={avg}"], "--model_dir is required"),
    ]
    for args, words in bad:
        result = run_cli("avg_checkpoints", *args)
        assert_user_error(result, "t2t-avg-all", words)
