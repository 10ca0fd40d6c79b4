"""Data parallelism on tf.distribute, tested so that wrong semantics cannot pass.

Each check runs in a subprocess, because the CPU must be split into logical devices
(or a TF_CONFIG set) before TensorFlow starts.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from support.cli_helpers import run_json_script


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


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(output_dir, train_steps, log_dir):
    """Two `t2t-trainer` processes forming one cluster on 127.0.0.1."""
    args = [
        sys.executable,
        "-m",
        "t2t_lite.bin.trainer",
        "--hparams_set=transformer_test",
        "--hparams=batch_size=64,max_length=16,optimizer_multistep_accumulate_steps=2",
        f"--output_dir={output_dir}",
        f"--train_steps={train_steps}",
        "--log_steps=1",
        "--save_checkpoints_steps=4",
        "--local_eval_frequency=0",
        "--eval_steps=2",
    ]
    return launch_workers(args, log_dir)


def launch_workers(args, log_dir, extra_env=({}, {}), cluster_env=None):
    """Runs command `args` as the two workers of one cluster on 127.0.0.1 (each
    with its TF_CONFIG, or cluster_env[i] instead, and extra_env[i]), logging to
    log_dir/workerI.log."""
    if cluster_env is None:
        cluster = {"worker": [f"127.0.0.1:{_free_port()}" for _ in range(2)]}
        cluster_env = [
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                )
            }
            for index in range(2)
        ]
    workers = []
    for index in range(2):
        env = {**os.environ, **extra_env[index], **cluster_env[index]}
        # Open for the worker's lifetime, not a with-block's:
        log = open(os.path.join(log_dir, f"worker{index}.log"), "w")  # noqa: SIM115
        workers.append(
            subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    return workers


def finish(workers, timeout=240):
    return [w.wait(timeout=timeout) for w in workers]


def newest_step(directory):
    steps = [
        int(name[len("model-") : -len(".index")])
        for name in os.listdir(directory)
        if name.startswith("model-") and name.endswith(".index")
    ]
    return max(steps, default=None)


def checkpointed_state(prefix):
    """Every checkpointed tensor but the input iterators (each worker's own)."""
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    return {
        key: np.asarray(reader.get_tensor(key))
        for key in reader.get_variable_to_shape_map()
        if not key.startswith(("train_iterator", "_CHECKPOINTABLE"))
    }


def _wait_for_line(path, text, process, timeout=180):
    """Waits until `text` appears in the log at `path` (or the process ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if text in path.read_text():
            return True
        time.sleep(0.2)
    return False


def _logs(tmp_path):
    return [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]


def _assert_workers_agree(run, step):
    """The chief's checkpoint and worker 1's hold the same state, bitwise."""
    chief = checkpointed_state(str(run / f"model-{step}"))
    other = checkpointed_state(str(run / "workers" / "worker-1" / f"model-{step}"))
    assert chief.keys() == other.keys() and len(chief) > 50
    for key in chief:  # weights, slots, accumulators, counters
        assert (chief[key] == other[key]).all(), key


@pytest.mark.slow
def test_two_tf_config_workers_stop_together_and_resume(tmp_path):
    """Two workers on 127.0.0.1: SIGTERM to one stops both at the same update with
    one save; the same command resumes both and finishes; the chief writes the run."""
    run = tmp_path / "run"
    workers = start_workers(run, 12, tmp_path)
    assert _wait_for_line(tmp_path / "worker0.log", "step 3, update", workers[0])
    workers[1].send_signal(signal.SIGTERM)
    codes = finish(workers)
    logs = _logs(tmp_path)
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "2 replicas = 256 tokens/update (simulating 4 GPUs)" in logs[0]
    assert "stopped by SIGTERM" in logs[1]
    assert "stopped by another worker" in logs[0]
    stopped = newest_step(run)
    assert stopped == newest_step(run / "workers" / "worker-1")
    assert stopped % 2 == 0 and 4 <= stopped < 12  # at an update, before the end
    _assert_workers_agree(run, stopped)

    workers = start_workers(run, 12, tmp_path)  # the same command resumes
    codes = finish(workers)
    logs = _logs(tmp_path)
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert f"Resumed from {run}/model-{stopped}" in logs[0]
    assert "Final eval at step 12 (update 6)" in logs[0]
    assert "worker done at step 12" in logs[1]
    _assert_workers_agree(run, 12)
    # One run directory, written by the chief; the other worker keeps only its own
    # checkpoints (its input positions) under workers/.
    assert sorted(os.listdir(run / "workers")) == ["worker-1"]
    assert (run / "hparams.json").exists() and (run / "metrics.jsonl").exists()
    assert not (run / "workers" / "worker-1" / "hparams.json").exists()
