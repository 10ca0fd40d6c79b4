"""Data parallelism on tf.distribute, tested so that wrong semantics cannot pass.

Each check runs in a subprocess, because the CPU must be split into logical devices
(or a TF_CONFIG set) before TensorFlow starts.
"""

import os
import signal
import sys
import time

import numpy as np
import pytest
from support.cli_helpers import run_json_script
from support.workers import (
    assert_same_state,
    assert_workers_agree,
    checkpointed_state,
    finish,
    launch_workers,
    newest_step,
    trainer_args,
    worker_logs,
)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def equivalence():
    return run_json_script("distributed_equivalence.py")


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["sgd", "momentum", "momentum_clip_decay", "momentum_split"]
)
def test_replicas_times_accumulation_equal_the_hand_computed_update(equivalence, case):
    """2 replicas × n=3 × 4 updates == w − lr(u)·g(u) computed by hand (docs/design.md §2)."""
    assert equivalence[f"{case}_updates"] == 4
    assert equivalence[f"{case}_micro_steps"] == 12
    assert equivalence[f"{case}_tracing_counts"] == [1, 1]  # one trace, all shapes
    assert equivalence[f"{case}_moved_ratio"] > 1000  # it did train
    assert equivalence[f"{case}_weights_ratio"] < 1  # within 1e-5 relative
    if case.startswith("momentum"):
        assert equivalence[f"{case}_slots_ratio"] < 1  # the optimizer state too


@pytest.mark.slow
def test_one_all_reduce_per_update_and_none_in_between(equivalence):
    """Counted where every all-reduce goes through (the strategy's CrossDeviceOps),
    while the sgd case's functions are traced (once: the counted graphs trained)."""
    assert equivalence["accumulate_groups"] == 0
    assert equivalence["update_groups"] == 1
    # gradients of every variable + loss + tokens + the workers' stop votes + the
    # noise scale's three sums (squared norms, inverse token counts, micro-batches)
    assert equivalence["update_tensors"] == equivalence["variables"] + 3 + 3
    # The control: an all-reduce added to each accumulate micro-step is seen.
    assert equivalence["control_accumulate_groups"] == 1


@pytest.mark.slow
def test_split_micro_batches_stay_exact_on_replicas(equivalence):
    """Micro-batches that ran out of memory were split on both replicas alike (the
    weights are checked with the other cases) and the parts do not communicate, so
    workers that split differently still meet in the same all-reduce."""
    assert equivalence["splits"] > 4
    assert equivalence["part_groups"] == 0


@pytest.mark.slow
def test_a_step_failing_on_one_replica_leaves_every_replica_as_it_was(equivalence):
    """Accumulate and update micro-steps: the other replica's accumulators and
    noise-scale sums were not written, the counters did not move."""
    assert equivalence["one_replica_fails_unchanged"] == [True, True]


# --- two workers on this machine (MultiWorkerMirroredStrategy via TF_CONFIG) --------


def start_workers(output_dir, log_dir):
    """Two `t2t-trainer` processes forming one cluster on 127.0.0.1, training the
    shared TWO_WORKER_RUN (tests/support/workers.py)."""
    return launch_workers(trainer_args(output_dir), log_dir)


def _wait_for_line(path, text, process, timeout=180):
    """Waits until `text` appears in the log at `path` (or the process ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if text in path.read_text():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_two_tf_config_workers_stop_together_and_resume(tmp_path, two_worker_reference):
    """Two workers on 127.0.0.1: SIGTERM to one stops both at the same update with
    one save; the same command resumes both and finishes where an uninterrupted
    run ends; the chief writes the run."""
    run = tmp_path / "run"
    workers = start_workers(run, tmp_path)
    assert _wait_for_line(tmp_path / "worker0.log", "step 3, update", workers[0])
    workers[1].send_signal(signal.SIGTERM)
    codes = finish(workers)
    logs = worker_logs(tmp_path)
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "2 replicas = 256 tokens/update (simulating 4 GPUs)" in logs[0]
    assert "stopped by SIGTERM" in logs[1]
    assert "stopped by another worker" in logs[0]
    stopped = newest_step(run)
    assert stopped == newest_step(run / "workers" / "worker-1")
    assert stopped % 2 == 0 and 4 <= stopped < 12  # at an update, before the end
    assert_workers_agree(run, stopped)

    workers = start_workers(run, tmp_path)  # the same command resumes
    codes = finish(workers)
    logs = worker_logs(tmp_path)
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert f"Resumed from {run}/model-{stopped}" in logs[0]
    assert "Final eval at step 12 (update 6)" in logs[0]
    assert "worker done at step 12" in logs[1]
    assert_workers_agree(run, 12)
    assert_same_state(run, two_worker_reference, 12)
    # One run directory, written by the chief; the other worker keeps only its own
    # checkpoints (its input positions) under workers/.
    assert sorted(os.listdir(run / "workers")) == ["worker-1"]
    assert (run / "hparams.json").exists() and (run / "metrics.jsonl").exists()
    assert not (run / "workers" / "worker-1" / "hparams.json").exists()


@pytest.mark.slow
def test_one_worker_out_of_memory_splits_alone_with_a_fixed_n_of_1(tmp_path):
    """A fixed n of 1 on two workers: worker 1's micro-step 5 runs out of memory and
    is accumulated in halves while worker 0 trains on unsplit; both finish where
    the same run without the fault ends (launched beside it; no dropout, whose
    halves would draw other masks), and the checkpoint holds no accumulators, as
    a fixed n of 1's never does. Creating them mid-run on worker 1 alone, as a
    one-host run does at its first split, would stop both workers: on several
    hosts that is a collective."""
    program = (sys.executable, os.path.join(HERE, "support", "faulty_trainer.py"))
    n_of_1 = (
        "--hparams=batch_size=64,max_length=16,optimizer_multistep_accumulate_steps=1,"
        "layer_prepostprocess_dropout=0,attention_dropout=0,relu_dropout=0"
    )
    launches = {}
    try:
        for name, faults in (("clean", {}), ("split", {"OOM_AT_STEP": "5"})):
            args = trainer_args(
                tmp_path / name, train_steps=8, program=program, extra=(n_of_1,)
            )
            (tmp_path / f"{name}_logs").mkdir()
            launches[name] = launch_workers(
                args, tmp_path / f"{name}_logs", ({}, faults)
            )
        for name, workers in launches.items():
            codes = finish(workers)
            logs = worker_logs(tmp_path / f"{name}_logs")
            assert codes == [0, 0], name + logs[0][-2000:] + logs[1][-2000:]
    finally:  # a failure or a hang leaves no worker behind
        for worker in [w for workers in launches.values() for w in workers]:
            if worker.poll() is None:
                worker.kill()
    logs = worker_logs(tmp_path / "split_logs")
    assert "Out of memory at step 5 on a micro-batch" in logs[1]
    assert "1 out-of-memory splits" in logs[1]
    assert "Out of memory" not in logs[0]
    assert "Final eval at step 8 (update 8)" in logs[0]
    got = checkpointed_state(tmp_path / "split" / "model-8")
    expected = checkpointed_state(tmp_path / "clean" / "model-8")
    assert got.keys() == expected.keys() and len(got) > 50
    assert not any("accumulator" in key for key in got)
    # Each worker counts its own splits (docs/memory.md).
    own = checkpointed_state(tmp_path / "split" / "workers" / "worker-1" / "model-8")
    splits = [key for key in got if key.startswith("oom_splits")]
    assert [got[k] for k in splits] == [0] and [own[k] for k in splits] == [1]
    # The noise scale takes each half for a micro-batch of its own (one more sample
    # of a small batch's gradient), so its estimate moves; the rest is the clean
    # run's to design.md §2.2's tolerance.
    for key in [k for k in got if not k.startswith("noise_scale")]:
        np.testing.assert_allclose(
            got[key], expected[key], rtol=1e-5, atol=1e-7, err_msg=key
        )
