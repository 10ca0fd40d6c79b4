"""A lost worker of a multi-host run (docs/distributed.md): the survivor stops with
one line, a rerun of the same command resumes both workers from the same step (the
newest one every worker can read) and ends where an uninterrupted run ends; TF_CONFIG
mistakes are one line each."""

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from support import forked
from support.workers import (
    assert_same_state,
    launch_workers,
    newest_step,
    trainer_args,
)

from t2t_lite.errors import UserError
from t2t_lite.training.cluster.distribution import read_tf_config
from t2t_lite.training.cluster.lost_worker import lost_tasks, newest_common_step

HERE = os.path.dirname(os.path.abspath(__file__))


def start(output_dir, **placements):
    """Two workers on 127.0.0.1 training the shared TWO_WORKER_RUN
    (tests/support/workers.py) into output_dir, logging to a new folder next to it;
    returns (workers, log folder). placements: kill_at_step, freeze_at_step or
    kill_in_save, each {worker: step} (tests/support/faulty_trainer.py)."""
    args = trainer_args(
        output_dir,
        program=(
            sys.executable,
            os.path.join(HERE, "support", "faulty_trainer.py"),
        ),
        extra=("--lost_worker_timeout=5",),
    )
    extra_env = [
        {
            name.upper(): str(steps[i])
            for name, steps in placements.items()
            if i in steps
        }
        for i in range(2)
    ]
    log_dir = tempfile.mkdtemp(prefix="logs-", dir=os.path.dirname(output_dir))
    return launch_workers(args, log_dir, extra_env), log_dir


def finish(launch, frozen=None):
    """Exit codes and logs of both workers of `launch` (start's result). frozen: a
    worker that stopped itself (SIGSTOP), killed once the other has exited, as an
    operator would."""
    workers, log_dir = launch
    if frozen is not None:
        workers[1 - frozen].wait(timeout=240)
        workers[frozen].kill()
    codes = [w.wait(timeout=240) for w in workers]  # a hang fails here
    logs = [Path(log_dir, f"worker{i}.log").read_text() for i in range(2)]
    return codes, logs


def last_line(log):
    return log.strip().splitlines()[-1]


def assert_lost_line(log, lost, steps, common):
    """The survivor's last line: regex alternatives `lost` (who) and `steps` (the
    step it was at: a survivor may finish the micro-step in flight), and the
    newest common checkpoint."""
    assert re.fullmatch(
        rf"t2t-trainer: error: ({lost}) of the run was lost( \(it stopped sending "
        rf"heartbeats\))? at step ({steps}); the newest checkpoint every worker has "
        rf"is step {common}; run the same command on every worker to resume\.",
        last_line(log),
    ), log[-3000:]


@pytest.mark.slow
def test_lost_workers_stop_the_other_and_reruns_resume_from_a_common_step(
    tmp_path, two_worker_reference
):
    """n=2, saves every 4 micro-steps, 12 in all; each rerun of the same command
    resumes the run the previous launch left and places the next loss."""
    run = tmp_path / "run"
    # The chief (also the coordination service's leader) hangs inside a window:
    # frozen before micro-step 5, after both saved step 4. Nothing closes its
    # sockets; worker 1 notices through its heartbeats.
    codes, logs = finish(start(run, freeze_at_step={0: 5}), frozen=0)
    assert codes == [-9, 2], logs[1][-3000:]
    assert_lost_line(logs[1], "worker 0|the other worker", "5|6", 4)

    # Worker 1 dies on entering the save of step 8, while the chief is in its
    # own: the chief's save fails on the lost peer, not on its output_dir.
    codes, logs = finish(start(run, kill_in_save={1: 8}))
    assert codes == [2, -9], logs[0][-3000:]
    assert f"Resumed from {run}/model-4 (global step 4" in logs[0]
    assert_lost_line(logs[0], "worker 1", "8", 4)
    assert "cannot write" not in logs[0]

    # The chief dies just before micro-step 9 (the update closing the window of
    # steps 8 and 9), after both saved step 8.
    codes, logs = finish(start(run, kill_at_step={0: 9}))
    assert codes == [-9, 2], logs[1][-3000:]
    assert_lost_line(logs[1], "worker 0", "9|10", 8)

    # Worker 1 lost every checkpoint (in a copy of the run): no step is on both,
    # nothing trains. Its launch runs alongside the next one.
    lost_all = tmp_path / "lost_all"
    shutil.copytree(run, lost_all)
    shutil.rmtree(lost_all / "workers" / "worker-1")
    refused = start(lost_all)

    # Worker 1's newest checkpoint is damaged: both resume from step 4 and end
    # where the uninterrupted run ended.
    data = run / "workers" / "worker-1" / "model-8.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])
    codes, logs = finish(start(run))
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    for log in logs:
        assert "worker 0: 8, worker 1: 4): every worker resumes from step 4" in log
    assert f"Resumed from {run}/model-4 (global step 4" in logs[0]
    assert_same_state(run, two_worker_reference, 12)

    codes, logs = finish(refused)
    assert codes == [2, 2], logs[0][-3000:]
    for log in logs:
        assert last_line(log) == (
            "t2t-trainer: error: the workers' newest checkpoints differ (worker 0: 8, "
            "worker 1: 0): worker 1 has no readable checkpoint; nothing was trained: "
            "restore its checkpoints (OUTPUT_DIR/workers/worker-I) or use a new "
            "output_dir."
        ), log[-2000:]
    assert newest_step(lost_all) == 8  # nothing deleted, nothing written


def cluster(jobs, task=None):
    config = {"cluster": jobs}
    if task is not None:
        config["task"] = task
    return json.dumps(config)


TWO = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{bad", "TF_CONFIG is not valid JSON"),
        ("[]", 'TF_CONFIG must be a JSON object with a "cluster" object.'),
        (
            cluster({"ps": ["a:1"]}, {"type": "ps", "index": 0}),
            "unknown job type 'ps'",
        ),
        (
            cluster(TWO, {"type": "worker", "index": 3}),
            "task index 3 is outside the cluster's 2 worker task(s) (0 to 1).",
        ),
        (
            cluster({"worker": ["a:1"]}, {"type": "chief", "index": 0}),
            "task type 'chief' is not a job of the cluster (worker).",
        ),
        (
            cluster({"worker": ["a:1"]}, {"type": "worker", "index": 1}),
            "task index 1 is outside the cluster's 1 worker task(s)",
        ),
        (cluster({"worker": []}, {"type": "worker"}), 'has no "chief" or "worker"'),
        (
            cluster({"worker": ["a:1", "a:1"]}, {"type": "worker", "index": 0}),
            "address a:1 is given twice (worker 0 and worker 1)",
        ),
        (cluster(TWO), 'TF_CONFIG needs "task"'),
        (cluster(TWO, {"type": "worker", "index": "1"}), "must be an integer"),
    ],
)
def test_tf_config_mistakes_are_one_line_errors(raw, message):
    with pytest.raises(UserError) as error:
        read_tf_config(raw)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_one_worker_tf_config_is_read():
    config = read_tf_config(cluster({"worker": ["a:1"]}, {"type": "worker"}))
    assert (config.workers, config.task_type, config.task_index) == (1, "worker", 0)
    assert read_tf_config("") is None


@pytest.mark.slow
def test_the_cli_refuses_a_bad_tf_config_before_writing(tmp_path):
    env = dict(os.environ, TF_CONFIG=cluster(TWO, {"type": "worker", "index": 3}))
    out = forked.run(
        [
            sys.executable,
            "-m",
            "t2t_lite.bin.trainer",
            "--hparams_set=transformer_test",
            f"--output_dir={tmp_path / 'run'}",
            "--train_steps=2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "t2t-trainer: error: TF_CONFIG: task index 3 is outside the cluster's 2 "
        "worker task(s) (0 to 1)."
    )
    assert not (tmp_path / "run").exists()


def test_lost_tasks_are_named_from_the_error_text_without_this_one():
    text = (
        "{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/"
        "task:0/device:CPU:0}} The following tasks are unhealthy (stopped sending "
        "heartbeats):\n/job:worker/replica:0/task:1"
    )
    assert lost_tasks(text, ("worker", 0)) == ["worker 1"]
    assert lost_tasks("Collective ops is aborted", ("worker", 1)) == []


def test_the_newest_common_step_is_on_every_worker(tmp_path):
    for directory, steps in (
        (tmp_path, (4, 8, 12)),
        (tmp_path / "workers" / "worker-1", (4, 8)),
    ):
        directory.mkdir(parents=True, exist_ok=True)
        for step in steps:
            (directory / f"model-{step}.index").write_text("")
    assert newest_common_step(str(tmp_path), 2) == 8
    assert newest_common_step(str(tmp_path / "none"), 2) is None


def test_an_unnamed_lost_peer_of_two_is_the_other_worker(tmp_path):
    import tensorflow as tf

    from t2t_lite.errors import is_peer_failure
    from t2t_lite.training.cluster.lost_worker import worker_lost

    error = tf.errors.DeadlineExceededError(
        None, None, "Collective ops is aborted by: Deadline Exceeded"
    )
    assert is_peer_failure(error)
    assert not is_peer_failure(tf.errors.DeadlineExceededError(None, None, "x"))
    assert str(worker_lost(error, ("worker", 1), str(tmp_path), 2, 8)).startswith(
        "the other worker of the run was lost at step 8; no checkpoint is on "
        "every worker yet"
    )
    assert "another worker" in str(worker_lost(error, ("worker", 1), "x", 3, 8))
