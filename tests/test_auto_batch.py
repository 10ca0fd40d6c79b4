"""batch_size=0 (auto, training/auto_batch.py): the micro-batch is the largest whose
update step fits, n follows from the tokens per update asked for, and a resumed run
reuses the recorded result without probing.

Memory is limited through SimulatedMemory (training/out_of_memory.py): a step over
`max_tokens` padded tokens raises the ResourceExhaustedError a device would.
"""

import json
import math
import os
import subprocess
import sys

import pytest

import t2t_lite  # noqa: F401
from t2t_lite.hparams import HParamsError
from t2t_lite.hparams_checks import validate
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.training.auto_batch import AutoBatchError, _largest, probe_batch_size
from t2t_lite.training.out_of_memory import MicroBatchTooLarge, SimulatedMemory
from t2t_lite.training.trainer import RunConfig, Trainer

MAX_LENGTH = 32  # transformer_test's
EFFECTIVE = 600  # tokens per update


def _hparams():
    return transformer_test().override(batch_size=0, effective_batch_size=EFFECTIVE)


def _trainer(output_dir, memory, train_steps, headroom):
    config = RunConfig(
        output_dir=str(output_dir),
        train_steps=train_steps,
        eval_steps=1,
        local_eval_frequency=0,
        memory_headroom=headroom,
    )
    return Trainer(config, _hparams(), simulated_memory=memory)


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
    with pytest.raises(MicroBatchTooLarge, match="source .* tokens, target") as error:
        resumed.train()
    assert "\n" not in str(error.value)
    assert checkpoint_files
    assert {p.name: p.read_bytes() for p in tmp_path.glob("model-*")} == (
        checkpoint_files
    )


def test_headroom_takes_a_fraction_of_the_sentences():
    memory = SimulatedMemory(max_tokens=10 * 2 * MAX_LENGTH)
    found = probe_batch_size(
        _hparams(),
        vocab_size=12,
        strategy=_default_strategy(),
        model="transformer",
        headroom=0.25,
        simulated_memory=memory,
    )
    assert found.largest_sentences == 10
    assert found.sentences == 7  # int(10 * 0.75)
    assert found.batch_size == 7 * (MAX_LENGTH + 1)


def test_the_search_finds_the_boundary_with_few_steps():
    for boundary in (1, 2, 3, 7, 64, 100, 1000):
        tried = []

        def fits(r, boundary=boundary):
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


def test_a_cpu_needs_a_memory_budget():
    with pytest.raises(AutoBatchError, match="needs --memory_budget") as raised:
        probe_batch_size(
            _hparams(), vocab_size=12, strategy=_default_strategy(), model="transformer"
        )
    assert "\n" not in str(raised.value)


@pytest.mark.slow
def test_a_memory_budget_bounds_the_micro_batch_on_a_cpu(tmp_path):
    """Through t2t-trainer, budgets of 4 and 8 MB measured by TensorFlow's allocator
    (its statistics need the BFC allocator on a CPU without oneDNN)."""
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    runs = {}
    for megabytes in (4, 8):
        output_dir = tmp_path / f"mb{megabytes}"
        command = [
            *(sys.executable, "-m", "t2t_lite.bin.trainer"),
            f"--output_dir={output_dir}",
            "--hparams_set=transformer_test",
            "--hparams=batch_size=0,effective_batch_size=100000",
            f"--memory_budget={megabytes / 1000}",
            "--train_steps=1",
            "--local_eval_frequency=0",
            "--eval_steps=1",
        ]
        process = subprocess.Popen(
            command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
        )
        runs[megabytes] = (process, output_dir)
    found = {}
    for megabytes, (process, output_dir) in runs.items():
        stderr = process.communicate(timeout=300)[1].decode()
        assert process.returncode == 0, stderr[-2000:]
        assert "batch_size auto:" in stderr
        found[megabytes] = json.loads((output_dir / "run.json").read_text())
        found[megabytes] = found[megabytes]["auto_batch"]
        assert found[megabytes]["limit"] == f"in memory_budget {megabytes / 1000:g} GB"
    cap = 100000 // (MAX_LENGTH + 1)  # one micro-batch as large as the update
    assert 1 < found[4]["largest_sentences"] < found[8]["largest_sentences"] < cap
    for result in found.values():
        assert result["sentences"] == int(0.9 * result["largest_sentences"])
        assert result["batch_size"] == result["sentences"] * (MAX_LENGTH + 1)


def _default_strategy():
    import tensorflow as tf

    return tf.distribute.get_strategy()
