"""--warm_start_from (model weights only, into a new run) and resuming a run written by
an earlier version (a newly declared hparam at its default; a changed input
pipeline)."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from support.cli_helpers import assert_user_error, run_cli

import t2t_lite  # noqa: F401
from t2t_lite.decoding.loading import load_for_decoding
from t2t_lite.errors import UserError
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.outputs import warm_start as warm_start_module
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions
from t2t_lite.training.opening import trainer_setup


def _trainer(output_dir, train_steps, hp=None, problem="algorithmic_reverse", **kw):
    options = TrainerOptions(
        problem=problem,
        model="transformer",
        output_dir=str(output_dir),
        train_steps=train_steps,
        eval_steps=1,
        local_eval_frequency=0,
        save_checkpoints_steps=1000,
        log_steps=1000,
        **kw,
    )
    return Trainer(options, hp or transformer_test())


def _weights(model):
    """{variable path without the model's own name: value}."""
    return {v.path.split("/", 1)[1]: v.numpy() for v in model.trainable_variables}


SOURCE_STEPS = 6


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    """A trained run to warm-start from (and to copy as an earlier version's run):
    (directory, its final weights, its update step)."""
    path = tmp_path_factory.mktemp("source")
    trainer = _trainer(path, SOURCE_STEPS)
    trainer.train()
    return path, _weights(trainer.model), trainer.step.update_step


def _copy(source_run, tmp_path):
    """A copy of the source run, to change without touching the original."""
    shutil.copytree(source_run[0], tmp_path / "run")
    return tmp_path / "run"


def _recording(monkeypatch, module):
    """Collects the messages of module.logging.warning."""
    messages = []
    original = module.logging.warning

    def record(message, *args):
        messages.append(message % args)
        original(message, *args)

    monkeypatch.setattr(module.logging, "warning", record)
    return messages


def test_warm_start_loads_weights_only(source_run, tmp_path):
    source, weights, _ = source_run
    new = _trainer(tmp_path, 4, warm_start_from=str(source))
    assert new.restore() == 0
    ours = _weights(new.model)
    assert ours.keys() == weights.keys()
    for key, value in weights.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    assert new.step.update_step == 0
    assert int(new.optimizer.iterations) == 0
    slots = [v for v in new.optimizer.variables if "momentum" in v.path]
    assert slots and all(not np.any(v.numpy()) for v in slots)  # fresh Adam slots
    new.train()  # trains on from there; its own checkpoint now exists
    trained = _weights(new.model)
    # A restart of the new run resumes its own checkpoint, not the warm start.
    again = _trainer(tmp_path, 4, warm_start_from=str(source))
    assert again.restore() == 4
    key = next(iter(trained))
    np.testing.assert_array_equal(_weights(again.model)[key], trained[key])
    assert not np.array_equal(trained[key], weights[key])


def test_warm_start_into_a_deeper_model_lists_the_new_variables(
    source_run, tmp_path, monkeypatch
):
    source, weights, _ = source_run
    warnings = _recording(monkeypatch, warm_start_module)
    deeper = transformer_test().override(num_decoder_layers=2)
    new = _trainer(tmp_path, 2, deeper, warm_start_from=str(source))
    new.restore()
    assert len(warnings) == 1
    assert "decoder_layer_1" in warnings[0] and "encoder_layer_0" not in warnings[0]
    ours = _weights(new.model)
    shared = [k for k in weights if k in ours]
    assert shared and all(np.array_equal(ours[k], weights[k]) for k in shared)


def test_warm_start_refuses_other_shapes_and_other_vocabularies(source_run, tmp_path):
    source = source_run[0]
    wider = transformer_test().override(hidden_size=32, filter_size=64)
    with pytest.raises(UserError, match=r"have another shape, e\.g. model/"):
        _trainer(tmp_path / "a", 2, wider, warm_start_from=str(source)).restore()
    with pytest.raises(UserError, match="another vocabulary"):
        _trainer(
            tmp_path / "b",
            2,
            problem="algorithmic_identity",
            warm_start_from=str(source),
        ).restore()


def test_cli_refuses_a_missing_warm_start_path_before_writing(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "trainer",
        f"--output_dir={out}",
        "--problem=algorithmic_reverse",
        "--hparams_set=transformer_test",
        "--train_steps=2",
        f"--warm_start_from={tmp_path / 'nothing'}",
    )
    assert_user_error(result, "t2t-trainer", "--warm_start_from", "nothing")
    assert not out.exists()


# --- resume across versions -----------------------------------------------------------


def test_a_run_from_before_a_new_hparam_resumes_and_decodes_at_its_default(
    tmp_path, source_run
):
    """effective_batch_size is the newest hparam: a hparams.json without it is what
    an earlier version wrote."""
    run_dir = _copy(source_run, tmp_path)
    path = run_dir / "hparams.json"
    stored = json.loads(path.read_text())
    del stored["effective_batch_size"], stored["activation_dtype"]
    path.write_text(json.dumps(stored))
    _, _, hp, _ = load_for_decoding(output_dir=str(run_dir))
    assert hp.activation_dtype == "float32" and hp.effective_batch_size == 0
    changed = transformer_test().override(activation_dtype="bfloat16")
    with pytest.raises(UserError, match=r"before hparam\(s\) activation_dtype existed"):
        _trainer(run_dir, SOURCE_STEPS + 2, changed)
    resumed = _trainer(run_dir, SOURCE_STEPS + 2)
    resumed.train()
    assert resumed.step.micro_step == SOURCE_STEPS + 2
    assert "effective_batch_size" in json.loads(path.read_text())


def test_a_changed_input_pipeline_restores_the_rest_and_warns_once(
    tmp_path, monkeypatch, source_run
):
    run_dir = _copy(source_run, tmp_path)
    _, saved, updates = source_run
    # The next version's pipeline has one more tf.data op: the saved iterator state
    # no longer fits it.
    original = Trainer._replica_train_dataset
    monkeypatch.setattr(
        Trainer,
        "_replica_train_dataset",
        lambda self, *a: original(self, *a).take(2**40),
    )
    warnings = _recording(monkeypatch, trainer_setup)
    resumed = _trainer(run_dir, SOURCE_STEPS + 2)
    inputs = trainer_setup.ReplicaInputs(
        resumed.strategy, resumed._replica_train_dataset
    )
    resumed._attach_iterators(inputs)
    assert resumed.restore() == SOURCE_STEPS
    assert resumed.step.update_step == updates
    ours = _weights(resumed.model)
    assert all(np.array_equal(ours[k], v) for k, v in saved.items())
    assert len([w for w in warnings if "data order restarts" in w]) == 1
    # Training goes on (one warning per resume from the old checkpoint), and its
    # next checkpoint holds the new pipeline's iterators: resuming that one is quiet.
    resumed = _trainer(run_dir, SOURCE_STEPS + 2)
    resumed.train()
    assert resumed.step.micro_step == SOURCE_STEPS + 2
    reader = tf.train.load_checkpoint(resumed.checkpoints.latest)
    assert any("iterator" in k for k in reader.get_variable_to_shape_map())
    later = _trainer(run_dir, SOURCE_STEPS + 4)
    later.train()
    assert (
        later.step.micro_step == SOURCE_STEPS + 4 and not later.input_pipeline_changed
    )
    assert len([w for w in warnings if "data order restarts" in w]) == 2
