"""t2t-trainer as a user runs it: a subprocess that trains and resumes (end to end),
then refusals to continue that run with other settings (in-process)."""

import json
import os

import pytest
from support.cli_helpers import (
    assert_user_error,
    run_cli,
    run_cli_subprocess,
    tiny_trainer_flags,
)

COMMON = tiny_trainer_flags("algorithmic_reverse")


def _checkpoint_files(output_dir):
    return sorted(f for f in os.listdir(output_dir) if f.startswith("model-"))


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A run of 8 micro-steps with n=2, then resumed to 12."""
    out = str(tmp_path_factory.mktemp("run"))
    flags = [
        *COMMON,
        f"--output_dir={out}",
        "--hparams=optimizer_multistep_accumulate_steps=2",
    ]
    first = run_cli_subprocess("trainer", *flags, "--train_steps=8")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli_subprocess("trainer", *flags, "--train_steps=12")
    assert second.returncode == 0, second.stderr[-3000:]
    return out, first, second


@pytest.mark.slow
def test_trains_writes_and_resumes(trained_dir):
    out, first, second = trained_dir
    assert "× 2 accumulation steps" in first.stderr
    assert "Final eval at step 8 (update 4)" in first.stdout
    assert "Resumed from" in second.stderr
    assert "Final eval at step 12 (update 6)" in second.stdout
    assert "model-4.index" in _checkpoint_files(out)
    assert "model-12.index" in _checkpoint_files(out)
    with open(os.path.join(out, "hparams.json")) as f:
        assert json.load(f)["optimizer_multistep_accumulate_steps"] == 2
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["global_step"] for r in records] == [4, 8, 12]
    assert [r["update_step"] for r in records] == [2, 4, 6]
    for record in records:
        assert {"loss", "accuracy", "sequence_accuracy"} <= set(record)
        assert 0.0 <= record["accuracy"] <= 1.0
    assert os.listdir(os.path.join(out, "train"))  # TensorBoard events
    assert os.listdir(os.path.join(out, "eval"))


@pytest.mark.slow
def test_refuses_a_run_with_other_hparams_and_keeps_its_checkpoints(trained_dir):
    out = trained_dir[0]
    before = _checkpoint_files(out)
    result = run_cli(
        "trainer",
        *COMMON,
        f"--output_dir={out}",
        "--train_steps=16",
        "--hparams=optimizer_multistep_accumulate_steps=4",
    )
    assert_user_error(
        result, "t2t-trainer", "optimizer_multistep_accumulate_steps", out
    )
    assert _checkpoint_files(out) == before


@pytest.mark.slow
def test_refuses_a_run_of_another_problem_and_keeps_its_checkpoints(trained_dir):
    out = trained_dir[0]
    before = _checkpoint_files(out)
    flags = [f for f in COMMON if not f.startswith("--problem")]
    result = run_cli(
        "trainer",
        *flags,
        "--problem=algorithmic_identity",
        f"--output_dir={out}",
        "--train_steps=16",
        "--hparams=optimizer_multistep_accumulate_steps=2",
    )
    assert_user_error(result, "t2t-trainer", "algorithmic_identity", out)
    assert _checkpoint_files(out) == before


def test_registry_help_lists_every_kind():
    result = run_cli("trainer", "--registry_help")
    assert result.returncode == 0
    for name in (
        "transformer",
        "algorithmic_reverse",
        "algorithmic_addition_decimal",
        "transformer_base_fake_gpu8",
        "transformer_base_multistep8",
        "multistep_adam",
        "adafactor",
    ):
        assert name in result.stdout
