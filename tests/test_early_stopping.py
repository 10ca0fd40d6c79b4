"""Early stopping, the best checkpoint (OUTPUT_DIR/best/) and
--keep_checkpoint_every_n_hours, through t2t-trainer in-process.

The fixture's run keeps the best checkpoint by *maximal* loss (an explicit
--noeval_early_stopping_metric_minimize, honoured though odd): the loss falls, so the
first evaluation stays the best, its checkpoint is the oldest one and
keep_checkpoint_max=1 deletes it from OUTPUT_DIR; early stopping after 8 steps
without improvement must then stop the run at step 12 of 40.
"""

import json
import os
import shutil

import pytest
from support.cli_helpers import assert_user_error, run_cli, tiny_trainer_flags

from t2t_lite.registry import PROBLEMS

COMMON = [
    *tiny_trainer_flags("algorithmic_reverse"),
    "--hparams=learning_rate_schedule=constant*linear_warmup*linear_decay",
    "--eval_early_stopping_metric=loss",
    "--noeval_early_stopping_metric_minimize",
    "--keep_checkpoint_max=1",
]


def _records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _checkpoints(directory):
    return sorted(
        int(f[len("model-") : -len(".index")])
        for f in os.listdir(directory)
        if f.startswith("model-") and f.endswith(".index")
    )


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("early"))
    result = run_cli(
        "trainer",
        *COMMON,
        f"--output_dir={out}",
        "--train_steps=40",
        "--eval_early_stopping_steps=8",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


@pytest.mark.slow
def test_stops_early_and_names_the_best_checkpoint(stopped_run):
    out, result = stopped_run
    best = os.path.join(out, "best", "model-4")
    assert "Final eval at step 12 (update 12)" in result.stdout
    assert "t2t-trainer: stopped early at step 12 (update 12): loss has not " in (
        result.stdout
    )
    assert f"best checkpoint: {best} (loss " in result.stdout
    assert "at step 4)" in result.stdout
    assert "Stopping early at step 12" in result.stderr
    # keep_checkpoint_max=1 deleted model-4 from the run; best/ keeps it, alone.
    assert _checkpoints(out) == [12]
    assert _checkpoints(os.path.join(out, "best")) == [4]
    for name in ("hparams.json", "run.json", "checkpoint", "best.json"):
        assert os.path.exists(os.path.join(out, "best", name)), name
    records = _records(out)
    assert [r["global_step"] for r in records] == [4, 8, 12]
    assert records[0]["loss"] > records[1]["loss"] > records[2]["loss"]
    for record in records:
        assert record["best_checkpoint"] == best
        assert record["best_loss"] == records[0]["loss"]
        assert record["best_global_step"] == 4
        assert record["wall_time"] > 1.7e9
    elapsed = [r["elapsed_seconds"] for r in records]
    assert 0 < elapsed[0] < elapsed[1] < elapsed[2]


@pytest.mark.slow
def test_decoder_decodes_with_the_best_checkpoint(stopped_run, tmp_path):
    out, _ = stopped_run
    sources, _ = PROBLEMS.get("algorithmic_reverse")().dev_text()
    source, target = tmp_path / "src.txt", tmp_path / "out.txt"
    source.write_text("\n".join(sources[:3]) + "\n")
    result = run_cli(
        "decoder",
        f"--checkpoint_path={out}/best/model-4",
        f"--decode_from_file={source}",
        f"--decode_to_file={target}",
        "--decode_hparams=beam_size=1",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"decoding with {out}/best/model-4" in result.stderr
    assert len(target.read_text().splitlines()) == 3


@pytest.mark.slow
def test_a_resume_remembers_the_best_and_the_stop(stopped_run, tmp_path):
    # On a copy, which the other tests do not read; the copy must also name its
    # own best checkpoint, not the original's.
    out = str(tmp_path / "early")
    shutil.copytree(stopped_run[0], out)
    again = run_cli(
        "trainer",
        *COMMON,
        f"--output_dir={out}",
        "--train_steps=40",
        "--eval_early_stopping_steps=8",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "The run had stopped early; evaluating only" in again.stderr
    assert "t2t-trainer: stopped early at step 12" in again.stdout
    assert _checkpoints(out) == [12]
    # Without early stopping and with another train_steps, it trains on: the
    # recovered best (the step-4 loss, maximized) is not beaten by step 16's.
    on = run_cli(
        "trainer",
        *COMMON,
        f"--output_dir={out}",
        "--train_steps=16",
        "--eval_early_stopping_steps=0",
    )
    assert on.returncode == 0, on.stderr[-3000:]
    assert "Resuming with train_steps=16; the run started with train_steps=40: " in (
        on.stderr
    )
    assert "linear_decay" in on.stderr
    assert "stopped early" not in on.stdout
    records = _records(out)
    assert [r["global_step"] for r in records] == [4, 8, 12, 16]
    assert records[-1]["best_checkpoint"] == os.path.join(out, "best", "model-4")
    assert records[-1]["elapsed_seconds"] > records[-2]["elapsed_seconds"]
    with open(os.path.join(out, "run.json")) as f:
        assert json.load(f)["train_steps"] == 16


@pytest.mark.slow
def test_keep_checkpoint_every_n_hours_keeps_old_checkpoints(tmp_path):
    out = str(tmp_path / "hours")
    result = run_cli(
        "trainer",
        *tiny_trainer_flags("algorithmic_reverse"),
        f"--output_dir={out}",
        "--train_steps=6",
        "--save_checkpoints_steps=2",
        "--local_eval_frequency=0",
        "--keep_checkpoint_max=1",
        "--keep_checkpoint_every_n_hours=1e-9",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _checkpoints(out) == [2, 4, 6]  # keep_checkpoint_max=1 alone keeps [6]
    # The best (loss, minimized by default) is the final evaluation's checkpoint.
    assert _checkpoints(os.path.join(out, "best")) == [6]
    assert f"best checkpoint: {out}/best/model-6 (loss " in result.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--eval_early_stopping_metric=bleu"], ["bleu", "translation problem"]),
        (["--eval_early_stopping_metric=perplexity"], ["eval_early_stopping_metric"]),
        (["--eval_early_stopping_steps=-1"], ["--eval_early_stopping_steps", "-1"]),
        (["--keep_checkpoint_every_n_hours=-2"], ["keep_checkpoint_every_n_hours"]),
    ],
)
def test_bad_early_stopping_flags_are_one_line_errors(tmp_path, args, fragments):
    out = tmp_path / "run"
    result = run_cli(
        "trainer",
        *tiny_trainer_flags("algorithmic_reverse"),
        f"--output_dir={out}",
        "--train_steps=4",
        *args,
    )
    assert_user_error(result, "t2t-trainer", *fragments)
    assert not os.path.exists(out / "hparams.json")  # nothing written
