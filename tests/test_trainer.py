"""Trainer-level tests: exact mid-window resume, one trace per function, start-up line."""

import pytest
import tensorflow as tf
from accumulation_helpers import tolerance_ratio

import t2t_lite  # noqa: F401
from t2t_lite.hparams_sets import transformer_base_fake_gpu8, transformer_test
from t2t_lite.training.trainer import RunConfig, Trainer, simulation_line

N = 4


def _hparams():
    """Dropout on (0.1 everywhere): resume must also restore the dropout RNG."""
    return transformer_test().override(optimizer_multistep_accumulate_steps=N)


def _trainer(output_dir, train_steps):
    config = RunConfig(
        problem="algorithmic_reverse",
        model="transformer",
        output_dir=str(output_dir),
        train_steps=train_steps,
        eval_steps=2,
        local_eval_frequency=0,
        save_checkpoints_steps=1000,
        log_steps=1000,
    )
    return Trainer(config, _hparams())


@pytest.mark.slow
def test_resume_mid_window_equals_uninterrupted_run(tmp_path):
    total, stop = 14, 6  # 6 % 4 == 2: the checkpoint is inside a window
    straight = _trainer(tmp_path / "straight", total)
    straight.train()

    first = _trainer(tmp_path / "resumed", stop)
    first.train()
    checkpoint = first.checkpoints.latest
    tokens = tf.train.load_variable(
        checkpoint, "accumulator/tokens/.ATTRIBUTES/VARIABLE_VALUE"
    )
    assert tokens > 0  # the saved accumulators hold a half-finished window

    resumed = _trainer(tmp_path / "resumed", total)
    resumed.train()
    assert resumed.step.micro_step == total
    assert resumed.step.update_step == total // N
    assert tolerance_ratio(resumed.model, straight.model) < 1

    # Control: the same resume without the accumulators' contents differs, so the
    # comparison above is able to fail.
    _trainer(tmp_path / "broken", stop).train()
    broken = _trainer(tmp_path / "broken", total)
    restore = broken.restore

    def restore_and_forget_window():
        step = restore()
        broken.step.accumulator.reset()
        return step

    broken.restore = restore_and_forget_window
    broken.train()
    assert tolerance_ratio(broken.model, straight.model) > 10


@pytest.mark.slow
def test_train_step_traces_once_across_bucket_shapes(tmp_path):
    trainer = _trainer(tmp_path, 24)
    trainer.train()
    shapes = set()
    for batch in trainer.dataset("train", training=True).take(24):
        shapes.add(tuple(batch["targets"].shape))
    assert len(shapes) > 3  # the batches really come in several shapes
    assert trainer.step.accumulate.experimental_get_tracing_count() == 1
    assert trainer.step.accumulate_and_update.experimental_get_tracing_count() == 1


def test_simulation_line_states_the_simulated_batch():
    assert simulation_line(transformer_base_fake_gpu8(), 1) == (
        "micro-batch 4096 tokens × 8 accumulation steps × 1 replica = 32768 "
        "tokens/update (simulating 8 GPUs)"
    )
    assert "× 2 replicas = 65536" in simulation_line(transformer_base_fake_gpu8(), 2)
