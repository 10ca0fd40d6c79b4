"""The bad-input table (docs/design.md §6): every user mistake gives exit status 2, one
line "t2t-trainer: error: ..." naming the input, no traceback, and leaves an existing
run's checkpoints untouched."""

import hashlib
import json
import os
import shutil

import pytest
from support.cli_helpers import assert_user_error, run_cli, run_cli_subprocess

BASE = [
    "--problem=algorithmic_reverse",
    "--model=transformer",
    "--hparams_set=transformer_test",
    "--train_steps=2",
    "--save_checkpoints_steps=2",
    "--local_eval_frequency=0",
    "--eval_steps=1",
]


def _fingerprint(directory):
    """Hashes of every file in a run directory (checkpoints, hparams, metrics)."""
    result = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                result[os.path.relpath(path, directory)] = hashlib.sha256(
                    f.read()
                ).hexdigest()
    return result


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("existing"))
    result = run_cli("trainer", *BASE, f"--output_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _prepare(kind, tmp_path, existing_run):
    """Returns the --output_dir for a row, setting up broken directories."""
    if kind == "existing":
        return existing_run
    out = tmp_path / "out"
    if kind == "attempt":  # an earlier run that stopped before its first checkpoint
        out.mkdir()
        (out / "hparams.json").write_text('{"hidden_size": 32}\n')
        (out / "flags.txt").write_text("--hparams_set=transformer_test\n")
    if kind == "under_a_file":
        (tmp_path / "file").write_text("not a directory")
        return str(tmp_path / "file" / "out")
    if kind in ("bad_hparams_json", "bad_run_json", "garbage_checkpoints"):
        shutil.copytree(existing_run, out)
        if kind == "bad_hparams_json":
            (out / "hparams.json").write_text("{not json")
        elif kind == "bad_run_json":
            (out / "run.json").write_text(json.dumps({"problem": 3}))
        else:
            for name in os.listdir(out):
                if name.startswith("model-") and ".data-" in name:
                    (out / name).write_bytes(b"garbage")
    return str(out)


# (extra flags, output dir kind, words the one-line message must contain)
ROWS = [
    (
        ["--eval_decode_hparams=beam_size=0"],
        "fresh",
        ["--eval_decode_hparams", "beam_size"],
    ),
    (["--hparams=hidden_sise=8"], "fresh", ["hidden_sise", "hidden_size"]),
    (["--hparams=hidden_size=big"], "fresh", ["hidden_size", "int"]),
    (["--hparams=hidden_size"], "fresh", ["name=value"]),
    (["--hparams==3"], "fresh", ["name=value"]),
    (["--hparams=hidden_size=8,hidden_size=16"], "fresh", ["hidden_size", "twice"]),
    (["--hparams=label_smoothing=yes"], "fresh", ["label_smoothing", "float"]),
    (
        ["--hparams=optimizer_multistep_accumulate_steps=-2"],
        "fresh",
        ["optimizer_multistep_accumulate_steps"],
    ),
    (
        ["--hparams=optimizer_multistep_accumulate_steps=2.5"],
        "fresh",
        ["optimizer_multistep_accumulate_steps", "int"],
    ),
    (["--hparams=learning_rate_schedule=constant*warmup"], "fresh", ["warmup"]),
    (["--hparams=optimizer=adamw"], "fresh", ["adamw", "adam"]),
    (["--hparams=hidden_size=0"], "fresh", ["hidden_size", "> 0"]),
    (["--hparams=batch_size=-1"], "fresh", ["batch_size", ">= 0"]),
    (
        ["--hparams=batch_size=0"],
        "fresh",
        ["batch_size=0 (auto)", "effective_batch_size"],
    ),
    (["--hparams=num_heads=3"], "fresh", ["num_heads", "hidden_size"]),
    # batch_size=0's refusals come after its run is built, before anything is written.
    (
        ["--hparams=batch_size=0,effective_batch_size=4096"],
        "fresh",
        ["batch_size=0 (auto)", "--memory_budget"],
    ),
    (
        ["--hparams=batch_size=0,effective_batch_size=4096"],
        "attempt",
        ["batch_size=0 (auto)", "--memory_budget"],
    ),
    (
        ["--hparams=batch_size=0,effective_batch_size=16", "--memory_budget=1"],
        "fresh",
        ["16 tokens per update", "max_length 32"],
    ),
    (
        ["--hparams=layer_prepostprocess_dropout=1.5"],
        "fresh",
        ["layer_prepostprocess_dropout"],
    ),
    (["--hparams=length_bucket_step=1.0"], "fresh", ["length_bucket_step"]),
    (["--hparams=shuffle_buffer_size=0"], "fresh", ["shuffle_buffer_size"]),
    (
        ["--hparams_set=transformer_bse"],
        "fresh",
        ["transformer_bse", "transformer_base"],
    ),
    (
        ["--problem=algorithmic_revers"],
        "fresh",
        ["algorithmic_revers", "algorithmic_reverse"],
    ),
    (["--model=transfomer"], "fresh", ["transfomer", "transformer"]),
    (["--train_steps=0"], "fresh", ["--train_steps"]),
    (["--train_steps=abc"], "fresh", ["--train_steps", "abc"]),
    (["--save_checkpoints_steps=0"], "fresh", ["--save_checkpoints_steps"]),
    (["--keep_checkpoint_max=-1"], "fresh", ["--keep_checkpoint_max"]),
    (["--local_eval_frequency=-5"], "fresh", ["--local_eval_frequency"]),
    (["--no_such_flag=1"], "fresh", ["no_such_flag"]),
    (["--flagfile=/nonexistent/run.flags"], "fresh", ["/nonexistent/run.flags"]),
    (["--output_dir="], None, ["--output_dir"]),
    ([], "under_a_file", ["output_dir", "file"]),
    (["--hparams=hidden_size=32"], "existing", ["hidden_size", "different hparams"]),
    (["--problem=algorithmic_identity"], "existing", ["algorithmic_identity"]),
    ([], "bad_hparams_json", ["hparams.json"]),
    ([], "bad_run_json", ["problem"]),
    ([], "garbage_checkpoints", ["no readable checkpoint"]),
    pytest.param(  # trains until it diverges
        [
            "--train_steps=40",
            (
                "--hparams=optimizer=sgd,learning_rate_schedule=constant,"
                "learning_rate_constant=1e30,max_consecutive_bad_updates=2"
            ),
        ],
        "trains",
        ["diverged", "NaN"],
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize("flags, kind, words", ROWS)
def test_bad_input_is_one_line_and_loses_nothing(
    flags, kind, words, tmp_path, existing_run
):
    args = [*BASE]
    out = None if kind is None else _prepare(kind, tmp_path, existing_run)
    if out is not None:
        args.append(f"--output_dir={out}")
    before = _fingerprint(existing_run)
    given = _listing(out)
    result = run_cli("trainer", *args, *flags)
    assert_user_error(result, "t2t-trainer", *words)
    assert _fingerprint(existing_run) == before
    # Refused before the run is opened, so nothing is written: a new output_dir is
    # not created. (A damaged checkpoint is found when restoring, after flags.txt.)
    if kind not in ("trains", "garbage_checkpoints"):
        assert _listing(out) == given


def _listing(directory):
    """None for no directory (or none given), else its files' hashes."""
    if directory is None or not os.path.isdir(directory):
        return None
    return _fingerprint(directory)


@pytest.mark.slow
def test_a_flag_mistake_exits_2_from_the_real_entry_point(tmp_path):
    """End to end: `python -m t2t_lite.bin.trainer` (TensorFlow start-up included)."""
    result = run_cli_subprocess(
        "trainer", *BASE, f"--output_dir={tmp_path}", "--train_steps=abc", fresh=True
    )
    assert_user_error(result, "t2t-trainer", "--train_steps", "abc")
    assert os.listdir(tmp_path) == []


def test_the_table_is_big_enough():
    assert len(ROWS) >= 25
