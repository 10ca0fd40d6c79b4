"""In-process reliability: skipped NaN updates, divergence stop, damaged checkpoints,
failed checkpoint writes."""

import glob
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from support.accumulation_helpers import build, run, tiny_hparams, uneven_micro_batches

from t2t_lite.errors import UserError
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.training.loop.trainer import DivergenceError, Trainer, TrainerOptions

pytestmark = pytest.mark.slow  # every test trains and checkpoints real runs


def _trainer(output_dir, train_steps, **overrides):
    options = TrainerOptions(
        problem="algorithmic_reverse",
        model="transformer",
        output_dir=str(output_dir),
        train_steps=train_steps,
        eval_steps=1,
        local_eval_frequency=0,
        save_checkpoints_steps=2,
        log_steps=1000,
    )
    hp = transformer_test().override(optimizer_multistep_accumulate_steps=2)
    return Trainer(options, hp.override(**overrides))


def _nan_like(variable):
    return tf.fill(variable.shape, float("nan"))


def test_a_nan_update_is_skipped_and_counted_then_training_goes_on():
    model, step = build(tiny_hparams(optimizer_multistep_accumulate_steps=2), 8)
    run(step, uneven_micro_batches(2))  # one good update
    victim = model.trainable_variables[-1]
    saved = victim.numpy()
    victim.assign(_nan_like(victim))
    before = [v.numpy() for v in model.trainable_variables[:-1]]
    slots = [v.numpy() for v in step.optimizer.variables]
    run(step, uneven_micro_batches(2, seed=1), start=2)
    assert step.update_step == 1  # the update was not applied ...
    assert int(step.skipped_updates) == 1 and int(step.bad_updates_in_a_row) == 1
    for old, new in zip(before, model.trainable_variables[:-1]):
        np.testing.assert_array_equal(old, new.numpy())  # ... to any weight
    for old, new in zip(slots, step.optimizer.variables):
        np.testing.assert_array_equal(old, new.numpy())  # ... or optimizer slot
    victim.assign(saved)
    run(step, uneven_micro_batches(2, seed=2), start=4)
    assert step.update_step == 2
    assert int(step.bad_updates_in_a_row) == 0 and int(step.skipped_updates) == 1


def test_consecutive_bad_updates_stop_the_run_and_keep_the_good_checkpoint(
    tmp_path, caplog
):
    trainer = _trainer(tmp_path, 40, max_consecutive_bad_updates=3)
    original = trainer.step.accumulate_and_update

    def poisoned(batch):  # from micro-step 4 on, a weight overflows
        if trainer.step.micro_step >= 4:
            victim = trainer.model.trainable_variables[0]
            victim.assign(_nan_like(victim))
        return original(batch)

    trainer.step.accumulate_and_update = poisoned
    caplog.set_level(logging.WARNING)
    with pytest.raises(DivergenceError, match="3 updates in a row") as info:
        trainer.train()
    assert "model-4" in str(info.value) and "\n" not in str(info.value)
    assert int(trainer.step.skipped_updates) == 3
    assert "Skipped updates with a NaN/Inf" in caplog.text
    assert "Not saving checkpoint" in caplog.text
    assert trainer.checkpoints.latest.endswith("model-4")
    reader = tf.train.load_checkpoint(trainer.checkpoints.latest)
    for name in reader.get_variable_to_dtype_map():
        if name.startswith("model/"):
            assert np.all(np.isfinite(reader.get_tensor(name))), name


@pytest.fixture(scope="module")
def four_step_run(tmp_path_factory):
    """A run with checkpoints model-2 and model-4, trained once for the module."""
    path = tmp_path_factory.mktemp("four_steps")
    _trainer(path, 4).train()
    return path


def _copy(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path, caplog, four_step_run
):
    tmp_path = _copy(four_step_run, tmp_path)
    (data_file,) = glob.glob(os.path.join(tmp_path, "model-4.data-*"))
    with open(data_file, "r+b") as f:
        f.truncate(os.path.getsize(data_file) // 2)
    caplog.set_level(logging.WARNING)
    resumed = _trainer(tmp_path, 4)
    assert resumed.restore() == 2
    assert "model-4" in caplog.text and "damaged" in caplog.text


@pytest.mark.parametrize("damage", [b"garbage{{", b"", None])
def test_a_damaged_or_missing_state_file_loses_no_checkpoint(
    tmp_path, four_step_run, damage
):
    tmp_path = _copy(four_step_run, tmp_path)
    state = os.path.join(tmp_path, "checkpoint")
    if damage is None:
        os.remove(state)
    else:
        with open(state, "wb") as f:
            f.write(damage)
    resumed = _trainer(tmp_path, 6)
    assert resumed.restore() == 4  # found on disk, not through the state file
    resumed.train()
    assert os.path.exists(os.path.join(tmp_path, "model-6.index"))


def test_no_readable_checkpoint_is_a_clear_error(tmp_path, four_step_run):
    tmp_path = _copy(four_step_run, tmp_path)
    for data_file in glob.glob(os.path.join(tmp_path, "model-*.data-*")):
        with open(data_file, "wb") as f:
            f.write(b"garbage")
    with pytest.raises(UserError, match="no readable checkpoint"):
        _trainer(tmp_path, 4).restore()


def test_a_failed_checkpoint_write_is_one_line_and_keeps_the_others(
    tmp_path, four_step_run
):
    tmp_path = _copy(four_step_run, tmp_path)
    trainer = _trainer(tmp_path, 4)
    trainer.train()  # resumes at step 4: already trained, it only evaluates
    assert trainer.step.micro_step == 4
    before = sorted(os.listdir(tmp_path))

    def disk_full(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    trainer.checkpoints.manager.save = disk_full
    with pytest.raises(UserError, match="No space left on device") as info:
        trainer.save()
    assert "\n" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == before
    assert _trainer(tmp_path, 6).restore() == 4  # the old checkpoint still loads
