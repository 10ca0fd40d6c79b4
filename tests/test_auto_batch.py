"""batch_size=0 (auto, training/opening/auto_batch.py): the micro-batch is the largest whose
update step fits, n follows from the tokens per update asked for, and a resumed run
reuses the recorded result without probing.

Memory is limited through SimulatedMemory (training/step/out_of_memory.py): a step over
`max_tokens` padded tokens raises the ResourceExhaustedError a device would.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from support import forked
from support.cli_helpers import assert_one_error_line

import t2t_lite  # noqa: F401
from t2t_lite.hparams import HParamsError
from t2t_lite.hparams_checks import validate
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.optim.batch_plan import largest_micro_batch
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions
from t2t_lite.training.opening.auto_batch import (
    AutoBatchError,
    _largest,
    probe_batch_size,
)
from t2t_lite.training.opening.build import build_training
from t2t_lite.training.step.out_of_memory import MicroBatchTooLarge, SimulatedMemory

MAX_LENGTH = 32  # transformer_test's
EFFECTIVE = 600  # tokens per update


def _hparams():
    return transformer_test().override(batch_size=0, effective_batch_size=EFFECTIVE)


def _trainer(output_dir, memory, train_steps, headroom):
    options = TrainerOptions(
        output_dir=str(output_dir),
        train_steps=train_steps,
        eval_steps=1,
        local_eval_frequency=0,
        memory_headroom=headroom,
    )
    return Trainer(options, _hparams(), simulated_memory=memory)


@pytest.mark.slow
def test_the_largest_micro_batch_that_fits_then_n_follows_and_resume_reuses_it(
    tmp_path, caplog
):
    caplog.set_level("INFO")
    # Room for 5 sentence pairs of MAX_LENGTH + MAX_LENGTH tokens, not 6.
    memory = SimulatedMemory(max_tokens=5 * 2 * MAX_LENGTH + 2 * MAX_LENGTH - 1)
    trainer = _trainer(tmp_path, memory, train_steps=4, headroom=0.0)
    # The longest bucket of batch_size b holds b // (MAX_LENGTH + 1) sentences.
    assert trainer.hp.batch_size == 5 * (MAX_LENGTH + 1)
    assert trainer.n == math.ceil(EFFECTIVE / trainer.hp.batch_size) == 4
    assert memory.refused >= 1 and memory.calls == trainer.auto_batch.probes
    assert "batch_size auto: 165 tokens per micro-batch" in caplog.text
    # Less memory while training than the probe had: micro-batches are split,
    # and the splits are counted in metrics.jsonl.
    trainer.step.simulated_memory = SimulatedMemory(max_tokens=3 * 2 * MAX_LENGTH)
    trainer.train()
    assert trainer.step.micro_step == 4 and trainer.step.update_step == 1
    splits = int(trainer.step.oom_splits)
    assert splits > 0 and "out-of-memory splits" in caplog.text
    metrics = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["oom_splits"] == splits
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["auto_batch"]["batch_size"] == 165
    assert run["auto_batch"]["largest_sentences"] == 5
    hparams = json.loads((tmp_path / "hparams.json").read_text())
    assert hparams["batch_size"] == 0  # as given: a resume gives it again

    # A resume under another limit (and headroom) keeps the recorded micro-batch
    # (its windows were sized with it) and does not probe.
    again = SimulatedMemory(max_tokens=10**6)
    resumed = _trainer(tmp_path, again, train_steps=8, headroom=0.5)
    assert again.calls == 0
    assert resumed.hp.batch_size == 165 and resumed.n == 4

    # Memory for less than one sentence pair: the run stops with one line naming
    # the pair's lengths, and its checkpoint stays as it was.
    checkpoint_files = {p.name: p.read_bytes() for p in tmp_path.glob("model-*")}
    resumed.step.simulated_memory = SimulatedMemory(max_tokens=2)
    with pytest.raises(MicroBatchTooLarge, match=r"source .* tokens, target") as error:
        resumed.train()
    assert "\n" not in str(error.value)
    assert checkpoint_files
    assert {p.name: p.read_bytes() for p in tmp_path.glob("model-*")} == (
        checkpoint_files
    )


@pytest.fixture(scope="module")
def provisional_run():
    """A run as TrainerSetup builds it for batch_size=0: one sentence per micro-batch."""
    return build_training(
        _hparams().override(batch_size=MAX_LENGTH + 1), vocab_size=12, train_steps=8
    )


def _probe(run, memory, headroom):
    return probe_batch_size(
        run,
        headroom=headroom,
        tokens_per_update=largest_micro_batch(run.hp, 1),
        simulated_memory=memory,
    )


def test_the_probe_puts_the_run_back_and_takes_headroom(provisional_run):
    run = provisional_run
    before = [v.numpy() for v in run.model.weights + run.optimizer.variables]
    memory = SimulatedMemory(max_tokens=10 * 2 * MAX_LENGTH)
    found = _probe(run, memory, headroom=0.25)
    assert found.largest_sentences == 10 and memory.refused == 3  # 16, 12, 11
    assert found.sentences == 7  # int(10 * 0.75); n = 3 needs 7 sentences too
    assert found.batch_size == 7 * (MAX_LENGTH + 1)
    after = [v.numpy() for v in run.model.weights + run.optimizer.variables]
    for expected, actual in zip(before, after, strict=True):
        np.testing.assert_array_equal(actual, expected)  # the probe stepped...
    assert run.step.micro_step == 0 and run.step.update_step == 0  # ...and undid it
    assert run.step.simulated_memory is None


def test_an_update_is_never_much_more_than_asked_for(provisional_run):
    """Room for every micro-batch up to a whole update: the search stops there,
    and the micro-batch is evened out so that n of them just reach the update."""
    found = _probe(provisional_run, SimulatedMemory(10**6), headroom=0.1)
    per_sentence = MAX_LENGTH + 1
    assert found.largest_sentences == EFFECTIVE // per_sentence  # the cap, 18
    n = math.ceil(EFFECTIVE / found.batch_size)
    assert EFFECTIVE <= n * found.batch_size < EFFECTIVE + n * per_sentence


def test_a_schedule_caps_the_micro_batch_at_its_smallest_update():
    assert largest_micro_batch(_hparams(), replicas=2) == EFFECTIVE // 2
    hp = transformer_test().override(
        batch_size=0, batch_size_schedule="linear:200,2000,10"
    )
    assert largest_micro_batch(hp, replicas=1) == 200
    hp.batch_size_schedule = "adaptive:400,4000"
    assert largest_micro_batch(hp, replicas=1) == 200  # MIN holds two micro-batches


def test_the_search_finds_the_boundary_with_few_steps():
    for boundary in (1, 2, 3, 7, 64, 100, 1000):
        tried = []

        def fits(r, boundary=boundary, tried=tried):
            tried.append(r)
            return r <= boundary

        assert _largest(fits, 2**20) == boundary
        assert len(tried) <= 2 * math.log2(boundary) + 2
    assert _largest(lambda r: False, 100) == 0
    assert _largest(lambda r: True, 100) == 100  # capped


def test_auto_needs_a_size_per_update_and_a_length():
    with pytest.raises(HParamsError, match="effective_batch_size or batch_size"):
        validate(transformer_test().override(batch_size=0))
    with pytest.raises(HParamsError, match="max_length > 0"):
        validate(_hparams().override(max_length=0))
    validate(
        transformer_test().override(batch_size=0, batch_size_schedule="steps:0=500")
    )


def test_a_cpu_needs_a_memory_budget(provisional_run):
    with pytest.raises(AutoBatchError, match="needs --memory_budget") as raised:
        probe_batch_size(provisional_run, tokens_per_update=EFFECTIVE)
    assert "\n" not in str(raised.value)


@pytest.mark.slow
def test_a_memory_budget_bounds_the_micro_batch_on_a_cpu(tmp_path):
    """Through t2t-trainer, budgets measured by TensorFlow's BFC allocator
    (TF_CPU_ALLOCATOR_USE_BFC=true): 4 and 8 MB bound the micro-batch, 1 KB holds
    less than one sentence pair's step. Without that allocator (oneDNN's counts no
    allocation under 256 KiB, a plain one keeps no statistics) the budget cannot be
    checked. A refused run writes nothing."""
    cases = {  # name: (TF_CPU_ALLOCATOR_USE_BFC, GB)
        "4mb": ("true", 0.004),
        "8mb": ("true", 0.008),
        "1kb": ("true", 0.000001),
        "no_bfc": ("false", 0.008),
    }
    runs = {}
    for name, (bfc, gigabytes) in cases.items():
        output_dir = tmp_path / name
        command = [
            *(sys.executable, "-m", "t2t_lite.bin.trainer"),
            f"--output_dir={output_dir}",
            "--hparams_set=transformer_test",
            "--hparams=batch_size=0,effective_batch_size=100000",
            f"--memory_budget={gigabytes}",
            "--train_steps=1",
            "--local_eval_frequency=0",
            "--eval_steps=1",
        ]
        env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": bfc}
        process = forked.popen(
            command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
        )
        runs[name] = (process, output_dir)
    found, stderr = {}, {}
    for name, (process, output_dir) in runs.items():
        stderr[name] = process.communicate(timeout=300)[1].decode()
        if name in ("1kb", "no_bfc"):
            assert process.returncode == 2, stderr[name][-2000:]
            assert not output_dir.exists()
            continue
        assert process.returncode == 0, stderr[name][-2000:]
        assert "batch_size auto:" in stderr[name]
        found[name] = json.loads((output_dir / "run.json").read_text())["auto_batch"]
        assert found[name]["limit"] == f"in memory_budget {cases[name][1]:g} GB"
    assert_one_error_line(
        stderr["1kb"],
        "t2t-trainer",
        "not even one sentence pair of max_length 32 tokens fits in memory_budget "
        "1e-06 GB (its step peaked at 0.000",
    )
    assert_one_error_line(
        stderr["no_bfc"], "t2t-trainer", "--memory_budget", "TF_CPU_ALLOCATOR_USE_BFC"
    )
    cap = 100000 // (MAX_LENGTH + 1)  # one micro-batch as large as the update
    assert 1 < found["4mb"]["largest_sentences"] < found["8mb"]["largest_sentences"]
    assert found["8mb"]["largest_sentences"] < cap
    for result in found.values():
        assert result["sentences"] == int(0.9 * result["largest_sentences"])
        assert result["batch_size"] == result["sentences"] * (MAX_LENGTH + 1)


@pytest.mark.slow
def test_adaptive_alone_follows_the_fitted_micro_batch(tmp_path):
    """`adaptive` counts MIN and MAX in micro-batches: after the probe the plan
    starts at two fitted micro-batches, not two of the provisional one."""
    options = TrainerOptions(
        output_dir=str(tmp_path),
        train_steps=2,
        eval_steps=1,
        local_eval_frequency=0,
        memory_headroom=0.0,
    )
    hp = transformer_test().override(batch_size=0, batch_size_schedule="adaptive")
    memory = SimulatedMemory(max_tokens=5 * 2 * MAX_LENGTH + 2 * MAX_LENGTH - 1)
    trainer = Trainer(options, hp, simulated_memory=memory)
    micro = trainer.hp.batch_size
    assert micro == 5 * (MAX_LENGTH + 1)  # the probe was not capped by the plan
    assert trainer.plan.minimum == 2 * micro and trainer.plan.target == 2 * micro
    trainer.train()
    assert trainer.step.update_step == 1 and trainer.step.micro_step == 2
