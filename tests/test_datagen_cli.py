"""As a user runs it: t2t-datagen on the built-in text problem (a subprocess, end to
end), then t2t-trainer for a few steps, a resume, and the refusals (other vocabulary,
no data), in-process."""

import json
import os

import pytest
from support.cli_helpers import (
    assert_user_error,
    run_cli,
    run_cli_subprocess,
    tiny_trainer_flags,
)

from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import TranslateNumbersEnFr

PROBLEM = "translate_numbers_en_fr"
TRAIN = tiny_trainer_flags(PROBLEM)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("numbers"))
    result = run_cli_subprocess(
        "datagen", f"--problem={PROBLEM}", f"--data_dir={path}", "--num_shards=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: 50000 examples written" in result.stdout
    assert "tokens per example" in result.stdout
    return path


@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("run"))
    first = run_cli(
        "trainer",
        *TRAIN,
        f"--data_dir={data_dir}",
        f"--output_dir={out}",
        "--train_steps=8",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli(
        "trainer",
        *TRAIN,
        f"--data_dir={data_dir}",
        f"--output_dir={out}",
        "--train_steps=12",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resumed from" in second.stderr
    return out


@pytest.mark.slow
def test_trains_on_text_and_reports_loss_and_accuracy(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["global_step"] for r in records] == [4, 8, 12]
    for record in records:
        assert record["loss"] > 0 and 0.0 <= record["accuracy"] <= 1.0
        assert record["eval_tokens"] > 0
    with open(os.path.join(run_dir, "run.json")) as f:
        assert json.load(f)["vocab_fingerprint"].startswith(
            "sentencepiece:shared:100/100:"
        )


@pytest.mark.slow
def test_restart_with_another_vocabulary_is_refused(run_dir, tmp_path):
    other = str(tmp_path / "other")
    problem = TranslateNumbersEnFr(train_size=3000, dev_size=100)
    datagen.generate(
        problem, other, config=datagen.DatagenConfig(vocab_size=100), log=lambda _: 0
    )
    before = sorted(os.listdir(run_dir))
    result = run_cli(
        "trainer",
        *TRAIN,
        f"--data_dir={other}",
        f"--output_dir={run_dir}",
        "--train_steps=16",
    )
    assert_user_error(result, "t2t-trainer", "vocab_fingerprint", run_dir)
    assert sorted(os.listdir(run_dir)) == before


def test_trainer_without_generated_data_says_what_to_run(tmp_path):
    result = run_cli(
        "trainer",
        *TRAIN,
        f"--data_dir={tmp_path}",
        f"--output_dir={tmp_path / 'run'}",
        "--train_steps=2",
    )
    assert_user_error(
        result,
        "t2t-trainer",
        f"run t2t-datagen with problem={PROBLEM}, data_dir={tmp_path}",
    )
    assert not os.path.exists(tmp_path / "run")
