"""Trainer-level tests: exact mid-window resume (a fixed n and a batch-size ramp), one
trace per function, start-up line."""

import json
import shutil

import pytest
import tensorflow as tf
from support.accumulation_helpers import tolerance_ratio

import t2t_lite  # noqa: F401
from t2t_lite.errors import UserError
from t2t_lite.hparams_sets import transformer_base_fake_gpu8, transformer_test
from t2t_lite.optim.batch_plan import plan_from_hparams
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions, simulation_line

N = 4


def _hparams():
    """Dropout on (0.1 everywhere): resume must also restore the dropout RNG."""
    return transformer_test().override(optimizer_multistep_accumulate_steps=N)


def _trainer(output_dir, train_steps):
    return _trainer_with(output_dir, train_steps, _hparams())


def _trainer_with(output_dir, train_steps, hp):
    options = TrainerOptions(
        problem="algorithmic_reverse",
        model="transformer",
        output_dir=str(output_dir),
        train_steps=train_steps,
        eval_steps=2,
        local_eval_frequency=0,
        save_checkpoints_steps=1000,
        log_steps=1000,
    )
    return Trainer(options, hp)


TOTAL, STOP = 14, 6  # 6 % 4 == 2: the checkpoint is inside a window


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A run trained TOTAL micro-steps without interruption."""
    trainer = _trainer(tmp_path_factory.mktemp("straight"), TOTAL)
    trainer.train()
    return trainer


@pytest.mark.slow
def test_resume_mid_window_equals_uninterrupted_run(tmp_path, straight):
    first = _trainer(tmp_path / "resumed", STOP)
    first.train()
    checkpoint = first.checkpoints.latest
    tokens = tf.train.load_variable(
        checkpoint, "accumulator/tokens/.ATTRIBUTES/VARIABLE_VALUE"
    )
    assert tokens > 0  # the saved accumulators hold a half-finished window
    shutil.copytree(tmp_path / "resumed", tmp_path / "broken")  # for the control

    resumed = _trainer(tmp_path / "resumed", TOTAL)
    resumed.train()
    assert resumed.step.micro_step == TOTAL
    assert resumed.step.update_step == TOTAL // N
    assert tolerance_ratio(resumed.model, straight.model) < 1

    # Control: the same resume without the accumulators' contents differs, so the
    # comparison above is able to fail.
    broken = _trainer(tmp_path / "broken", TOTAL)
    restore = broken.restore

    def restore_and_forget_window():
        step = restore()
        broken.step.accumulator.reset()
        return step

    broken.restore = restore_and_forget_window
    broken.train()
    assert tolerance_ratio(broken.model, straight.model) > 10


@pytest.mark.slow
def test_train_step_traces_once_across_bucket_shapes(straight):
    shapes = set()
    for batch in straight.dataset("train", training=True).take(TOTAL):
        shapes.add(tuple(batch["targets"].shape))
    assert len(shapes) > 3  # the batches it trained on really come in several shapes
    assert straight.step.accumulate.experimental_get_tracing_count() == 1
    assert straight.step.accumulate_and_update.experimental_get_tracing_count() == 1


def _line(hp, replicas):
    return simulation_line(hp, replicas, plan_from_hparams(hp, replicas))


def test_simulation_line_states_the_simulated_batch():
    assert _line(transformer_base_fake_gpu8(), 1) == (
        "micro-batch 4096 tokens × 8 accumulation steps × 1 replica = 32768 "
        "tokens/update (simulating 8 GPUs)"
    )
    assert "× 2 replicas = 65536" in _line(transformer_base_fake_gpu8(), 2)


def test_simulation_line_states_the_effective_batch_rounding():
    hp = transformer_test().override(batch_size=2048, effective_batch_size=10000)
    assert _line(hp, 1) == (
        "micro-batch 2048 tokens × 5 accumulation steps × 1 replica = 10240 "
        "tokens/update (simulating 5 GPUs); accumulation steps = "
        "ceil(effective_batch_size 10000 / (2048 × 1)) = 5, rounded up by 240 tokens"
    )
    assert "× 3 accumulation steps × 2 replicas = 12288" in _line(hp, 2)


def test_run_json_records_n_and_an_older_run_json_is_completed(tmp_path):
    """run.json records the resolved n; a run.json from before that key existed is
    completed on resume, not refused; a different n is refused in one line."""
    hp = transformer_test().override(effective_batch_size=3 * 256)
    _trainer_with(tmp_path, 2, hp).train()
    path = tmp_path / "run.json"
    stored = json.loads(path.read_text())
    assert stored["accumulate_steps"] == 3
    del stored["accumulate_steps"]
    path.write_text(json.dumps(stored))
    assert _trainer_with(tmp_path, 2, hp).n == 3
    assert json.loads(path.read_text())["accumulate_steps"] == 3
    stored["accumulate_steps"] = 4
    path.write_text(json.dumps(stored))
    with pytest.raises(UserError, match=r"accumulate_steps 4, not 3 .effective_batch"):
        _trainer_with(tmp_path, 2, hp)


RAMP = "steps:0=256,2=512,4=1024"  # batch_size 256: windows of 1, 1, 2, 2, 4, 4, ...


def _ramp_trainer(output_dir, train_steps):
    return _trainer_with(
        output_dir, train_steps, transformer_test().override(batch_size_schedule=RAMP)
    )


@pytest.mark.slow
def test_a_ramp_resumed_inside_a_window_equals_the_uninterrupted_run(tmp_path, caplog):
    """9 micro-steps are windows 1, 1, 2, 2 and 3 of 4; a run stopped at 5 (inside
    the second window of 2) and resumed to 9 ends where the uninterrupted one does.
    Start-up and log lines state the batch; the evaluation records it."""
    caplog.set_level("INFO")
    straight = _ramp_trainer(tmp_path / "straight", 9)
    record = straight.train()
    lines = [r.getMessage() for r in caplog.records]
    assert any("batch_size_schedule steps:0=256" in line for line in lines)
    assert any("Batch size grows from 1 at step 2, update 2" in line for line in lines)
    assert any("Batch size grows from 2 at step 6, update 4" in line for line in lines)
    assert straight.step.update_step == 4 and straight.step.window() == (4, 3)
    assert record["tokens_per_update"] == 1024
    assert record["tokens_seen"] == int(tf.convert_to_tensor(straight.step.tokens_seen))
    assert record["tokens_seen"] > 0 and record["noise_scale"] > 0
    with open(tmp_path / "straight" / "metrics.jsonl") as f:
        stored = json.loads(f.read().splitlines()[-1])
    assert stored["tokens_per_update"] == 1024 and stored["noise_scale"] > 0
    first = _ramp_trainer(tmp_path / "resumed", 5)
    first.train()
    assert first.step.window() == (2, 1)
    resumed = _ramp_trainer(tmp_path / "resumed", 9)
    resumed.train()
    assert resumed.step.window() == (4, 3) and resumed.step.update_step == 4
    assert tolerance_ratio(resumed.model, straight.model) < 1
