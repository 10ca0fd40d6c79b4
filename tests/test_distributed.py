"""Data parallelism on tf.distribute, tested so that wrong semantics cannot pass.

Each check runs in a subprocess, because the CPU must be split into logical devices
(or a TF_CONFIG set) before TensorFlow starts.
"""

import os
import signal
import time

import pytest
from support.cli_helpers import run_json_script
from support.workers import (
    assert_same_state,
    assert_workers_agree,
    finish,
    launch_workers,
    newest_step,
    trainer_args,
    worker_logs,
)


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
