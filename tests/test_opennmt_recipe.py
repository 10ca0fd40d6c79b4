"""scripts/opennmt_recipe.py's bad input (docs/design.md §6): exit status 2, one line
naming the input, nothing written. Run as a subprocess (the script imports neither
TensorFlow nor OpenNMT before its checks, so each case takes a fraction of a second);
no OpenNMT-tf run here: the driver itself is exercised by hand (its docstring)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(
    os.path.dirname(__file__), os.pardir, "scripts", "opennmt_recipe.py"
)
DATA = "translate_parallel_text"


@pytest.fixture
def setup(tmp_path):
    """A stand-in venv (an onmt-main file) and a data dir whose manifest names a
    training corpus of known sizes; returns the common arguments."""
    onmt_main = tmp_path / "venv" / "bin" / "onmt-main"
    onmt_main.parent.mkdir(parents=True)
    onmt_main.write_text("")
    data = tmp_path / "data"
    data.mkdir()
    corpus = []
    for side, text in (("en", "a b\n"), ("de", "x y z\n")):
        (tmp_path / f"train.{side}").write_text(text)
        corpus.append({"path": str(tmp_path / f"train.{side}"), "bytes": len(text)})
    manifest = {"identity": {"corpus": {"train": [corpus]}}}
    (data / f"{DATA}.manifest.json").write_text(json.dumps(manifest))
    for name in (".vocab.model", "-dev.source.txt", "-dev.target.txt"):
        (data / f"{DATA}{name}").write_text("x\n")
    core = min(os.sched_getaffinity(0))
    work = tmp_path / "work"
    return tmp_path, [
        f"--data_dir={data}",
        f"--venv={tmp_path / 'venv'}",
        f"--core={core}",
        f"--work_dir={work}",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, names",
    [
        (["--minutes=0"], "--minutes"),
        (["--marks=0"], "--marks"),
        (["--core=99999"], "--core 99999"),
        (["--venv=/nonexistent"], "/nonexistent"),
        (["--data_dir=/nonexistent"], "--data_dir /nonexistent"),
        (["--train_source={tmp}/train.de"], "--train_source"),
        (["--compare_with={tmp}"], "--compare_with"),
        ("missing_dev_text", f"{DATA}-dev.target.txt"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(setup, extra, names):
    tmp_path, args = setup
    if extra == "missing_dev_text":
        os.remove(tmp_path / "data" / f"{DATA}-dev.target.txt")
        extra = []
    args += [a.format(tmp=tmp_path) for a in extra]
    result = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opennmt_recipe.py: error: ")
    assert names in lines[0]
    assert not (tmp_path / "work").exists()
