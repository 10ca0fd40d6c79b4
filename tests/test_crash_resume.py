"""t2t-trainer killed for real: SIGTERM, then SIGKILL mid-window, then the same command.

With --deterministic and dropout on, the resumed run's final checkpoint is bitwise
equal to an uninterrupted run's: model, optimizer slots, counters, accumulators.

The SIGKILL step is drawn at random from a printed seed; to replay a failure, set
CRASH_RESUME_SEED to the seed in its captured output.
"""

import os
import random
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from support import forked
from support.cli_helpers import run_cli_subprocess

pytestmark = pytest.mark.slow  # trains in subprocesses, several times

TRAIN_STEPS = 24
FLAGS = [
    "--problem=algorithmic_reverse",
    "--hparams_set=transformer_test",
    "--hparams=optimizer_multistep_accumulate_steps=4",
    f"--train_steps={TRAIN_STEPS}",
    "--save_checkpoints_steps=4",
    "--local_eval_frequency=0",
    "--eval_steps=1",
    "--log_steps=1",
    "--deterministic",
]
COMMAND = [sys.executable, "-m", "t2t_lite.bin.trainer", *FLAGS]


def _run(output_dir):
    result = run_cli_subprocess("trainer", *FLAGS, f"--output_dir={output_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _start_and_signal(output_dir, at_step, signum):
    """Starts the trainer, sends `signum` once it logged micro-step `at_step`."""
    process = forked.popen(
        [*COMMAND, f"--output_dir={output_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in process.stdout:
        seen.append(line)
        match = re.search(r"\] step (\d+), update", line)
        if match and int(match.group(1)) >= at_step:
            process.send_signal(signum)
            break
    rest, _ = process.communicate(timeout=300)
    return process.returncode, "".join(seen) + rest


def _final_state(output_dir):
    """Every saved tensor of the final checkpoint except bookkeeping ones."""
    reader = tf.train.load_checkpoint(os.path.join(output_dir, f"model-{TRAIN_STEPS}"))
    names = [
        n
        for n in reader.get_variable_to_dtype_map()
        if not n.startswith(("save_counter", "train_iterator", "_CHECKPOINTABLE"))
    ]
    return {n: reader.get_tensor(n) for n in names}


def _assert_bitwise_equal(a, b):
    assert sorted(a) == sorted(b)
    assert any(n.startswith("model/") for n in a)
    assert any(n.startswith("optimizer/") for n in a)
    assert any(n.startswith("accumulator/") for n in a)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    _run(out)
    return _final_state(out)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """One run interrupted twice, three launches of the same command: SIGTERM once
    it logged micro-step 6; the resumed run SIGKILLed inside a window after its own
    first checkpoint (at a step drawn from a printed seed); the same command again,
    to the end. What each launch showed, recorded as it ended."""
    out = str(tmp_path_factory.mktemp("interrupted"))
    code, log = _start_and_signal(out, 6, signal.SIGTERM)
    stopped = re.search(r"stopped by SIGTERM at step (\d+)", log)
    step = int(stopped.group(1)) if stopped else None
    sigterm = {
        "code": code,
        "log": log,
        "step": step,
        "saved": step is not None
        and os.path.exists(os.path.join(out, f"model-{step}.index")),
    }
    # After the resumed run's first checkpoint (step 8 at the earliest), at a
    # micro-step that is not an update.
    seed = int(os.environ.get("CRASH_RESUME_SEED") or random.randrange(2**32))
    first = max((step or 6) + 1, 9)
    at_step = random.Random(seed).choice([s for s in range(first, 20) if s % 4])
    print(f"SIGKILL at step {at_step}: CRASH_RESUME_SEED={seed} replays it")
    code, log = _start_and_signal(out, at_step, signal.SIGKILL)
    sigkill = {
        "code": code,
        "log": log,
        "final_saved": os.path.exists(os.path.join(out, f"model-{TRAIN_STEPS}.index")),
    }
    rerun = _run(out)
    return {
        "sigterm": sigterm,
        "sigkill": sigkill,
        "rerun": rerun,
        "final": _final_state(out),
    }


def test_sigkill_inside_a_window_then_rerun_gives_identical_weights(
    interrupted, uninterrupted
):
    killed = interrupted["sigkill"]
    assert killed["code"] == -signal.SIGKILL, killed["log"][-2000:]
    assert not killed["final_saved"]
    assert "Resumed from" in interrupted["rerun"].stderr
    _assert_bitwise_equal(interrupted["final"], uninterrupted)


def test_sigterm_checkpoints_exits_zero_and_resumes_identically(
    interrupted, uninterrupted
):
    stopped = interrupted["sigterm"]
    assert stopped["code"] == 0, stopped["log"][-2000:]
    assert stopped["step"] is not None, stopped["log"][-2000:]
    assert stopped["step"] < TRAIN_STEPS
    assert stopped["saved"]
    assert "Run the same command to resume" in stopped["log"]
    # The next launch (the one SIGKILLed later) resumed from that very step.
    resumed = interrupted["sigkill"]["log"]
    assert f"global step {stopped['step']}" in resumed, resumed[-2000:]
    _assert_bitwise_equal(interrupted["final"], uninterrupted)


def test_two_deterministic_runs_are_bitwise_identical(tmp_path, uninterrupted):
    _run(tmp_path)
    _assert_bitwise_equal(_final_state(tmp_path), uninterrupted)
