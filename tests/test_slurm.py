"""SLURM clusters (docs/distribution.md): the variables srun sets become the same
checked cluster a TF_CONFIG gives, mistakes are one line each, and two local
processes with srun's variables (and no TF_CONFIG) train as one two-worker cluster."""

import json
import socket

import pytest
from support.cli_helpers import assert_user_error, run_cli, run_cli_subprocess
from support.workers import (
    TRAINER,
    assert_same_state,
    assert_workers_agree,
    finish,
    free_port,
    launch_workers,
    trainer_args,
)

from t2t_lite.errors import UserError
from t2t_lite.registry import HPARAMS_SETS
from t2t_lite.training.cluster.distribution import check_port_free, resolve_cluster
from t2t_lite.training.reporting.reporter import TRAIN_STEPS_FACTORS


def srun_env(rank, nodelist="localhost", tasks_per_node="2", tasks=2, **more):
    """What srun sets for task `rank` of step 0 of job 4242 (TF_CONFIG unset)."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_NTASKS": str(tasks),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
    }
    env.update(more)
    return env


def test_tasks_are_numbered_node_after_node_in_slurms_order():
    """node9 before node10, as SLURM numbers them; a node's k-th task on port+k."""
    env = srun_env(
        3, "node[9-10]", "2(x2)", 4, SLURM_LOCALID="1", SLURMD_NODENAME="node10"
    )
    cluster = resolve_cluster("slurm", 8888, env)
    assert cluster.jobs == {
        "worker": ["node9:8888", "node9:8889", "node10:8888", "node10:8889"]
    }
    assert (cluster.task_type, cluster.task_index) == ("worker", 3)
    assert cluster.describe() == (
        "cluster: SLURM job 4242 step 0, 4 task(s) on node[9-10] (port 8888-8889); "
        "this is worker 3 (node10:8889)"
    )
    mixed = resolve_cluster("slurm", 2000, srun_env(0, "gpu[08-10],big7", "1(x4)", 4))
    assert mixed.jobs["worker"] == [
        "gpu08:2000",
        "gpu09:2000",
        "gpu10:2000",
        "big7:2000",
    ]
    assert json.loads(mixed.tf_config)["task"] == {"type": "worker", "index": 0}


def test_tensorflows_resolver_orders_nodes_as_strings(monkeypatch):
    """Why training/cluster/slurm.py assembles the cluster itself: SlurmClusterResolver
    gives node10 the first addresses, so SLURM's task 0 (on node9) would take
    node10's."""
    import tensorflow as tf

    for name, value in srun_env(0, "node[9-10]", "1(x2)").items():
        monkeypatch.setenv(name, value)
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        gpus_per_node=1, gpus_per_task=1, auto_set_gpu=False
    )
    assert resolver.cluster_spec().as_dict()["worker"] == ["node10:8888", "node9:8888"]


def test_auto_takes_tf_config_then_a_step_of_several_tasks_then_this_host():
    tf_config = json.dumps(
        {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    )
    both = dict(srun_env(0), TF_CONFIG=tf_config)
    assert resolve_cluster("auto", environ=both).origin == "TF_CONFIG, 2 task(s) on a,b"
    assert resolve_cluster("tf_config", environ=both).task_index == 1
    assert resolve_cluster("auto", environ=srun_env(1)).origin.startswith("SLURM")
    assert (
        resolve_cluster("auto", environ=srun_env(0, tasks_per_node="1", tasks=1))
        is None
    )
    batch_script = {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}
    assert resolve_cluster("auto", environ=batch_script) is None
    assert resolve_cluster("auto", environ={}) is None
    assert resolve_cluster("none", environ=both) is None
    one = resolve_cluster("slurm", environ=srun_env(0, tasks_per_node="1", tasks=1))
    assert one.workers == 1  # trains on this host alone, saying so
    # A TF_CONFIG that says what SLURM says is no conflict (a second run in-process).
    agreeing = dict(
        srun_env(1), TF_CONFIG=resolve_cluster("slurm", 8888, srun_env(1)).tf_config
    )
    assert resolve_cluster("slurm", 8888, agreeing).task_index == 1


@pytest.mark.parametrize(
    "source, env, message",
    [
        (
            "slurm",
            {},
            (
                "--cluster=slurm: SLURM_PROCID is not set, so this is not a task of a "
                "SLURM job step; start t2t-trainer with srun"
            ),
        ),
        (  # inside the sbatch script, not in a step
            "slurm",
            {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"},
            "SLURM_STEP_NUM_TASKS is not set",
        ),
        (
            "slurm",
            srun_env(0, tasks=0),
            "SLURM_STEP_NUM_TASKS is 0: the step has no tasks.",
        ),
        (
            "slurm",
            srun_env(0, "node[1-2]", "1(x2)", 3),
            (
                "SLURM_STEP_NUM_TASKS is 3 but SLURM_STEP_TASKS_PER_NODE places 2 task(s) "
                "on node[1-2]."
            ),
        ),
        (
            "slurm",
            srun_env(0, "node[1-2]", "1(x3)", 3),
            (
                "SLURM_STEP_TASKS_PER_NODE gives task counts for 3 node(s) but "
                "SLURM_STEP_NODELIST 'node[1-2]' names 2."
            ),
        ),
        (
            "slurm",
            srun_env(0, "node[1-", "1"),
            "SLURM_STEP_NODELIST 'node[1-' is not in",
        ),
        ("slurm", srun_env(0, "a", "2x"), "SLURM_STEP_TASKS_PER_NODE '2x' is not in"),
        ("slurm", srun_env(0, "a,a", "1(x2)"), "names a node twice"),
        (
            "slurm",
            srun_env(2),
            "SLURM_PROCID 2 is outside the step's 2 task(s) (0 to 1).",
        ),
        ("slurm", srun_env("x"), "SLURM_PROCID must be an integer, got 'x'."),
        (  # --distribution=cyclic: task 1 on node2
            "slurm",
            srun_env(
                1, "node[1-2]", "2(x2)", 4, SLURM_LOCALID="0", SLURMD_NODENAME="node2"
            ),
            (
                "SLURM task 1 runs on node2 as local task 0, but t2t_lite numbers tasks "
                "node after node in SLURM_STEP_NODELIST's order, which puts it on node1 as "
                "local task 1; start the step with srun's default --distribution=block."
            ),
        ),
        (
            "slurm",
            dict(
                srun_env(1),
                TF_CONFIG=json.dumps(
                    {
                        "cluster": {"worker": ["a:1", "b:1"]},
                        "task": {"type": "worker", "index": 0},
                    }
                ),
            ),
            (
                "TF_CONFIG and --cluster=slurm disagree: TF_CONFIG makes this task worker 0 "
                "(a:1) of 2, SLURM worker 1 (localhost:8889) of 2; unset TF_CONFIG"
            ),
        ),
        ("tf_config", srun_env(0), "--cluster=tf_config but TF_CONFIG is not set"),
        ("k8s", {}, "cluster must be one of auto, tf_config, slurm, none, got 'k8s'."),
    ],
)
def test_slurm_mistakes_are_one_line_errors(source, env, message):
    with pytest.raises(UserError) as error:
        resolve_cluster(source, 8888, env)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_ports_beyond_65535_are_refused():
    with pytest.raises(
        UserError, match=r"cluster_port 65535: with 2 task\(s\) on a node"
    ):
        resolve_cluster("slurm", 65535, srun_env(0))


def test_a_taken_port_is_refused_and_a_free_one_is_not():
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cluster = resolve_cluster("slurm", port, srun_env(0, SLURM_LOCALID="0"))
        with pytest.raises(UserError) as error:
            check_port_free(cluster)
    assert str(error.value).startswith(
        f"port {port} of this task (worker 0, localhost:{port}) cannot be used on this "
        "host ("
    )
    assert str(error.value).endswith(
        "another process holds it; choose another first port with --cluster_port."
    )
    check_port_free(cluster)  # released: free again


def test_the_cli_refuses_slurm_outside_a_step_before_writing(tmp_path):
    run = tmp_path / "run"
    result = run_cli(
        "trainer",
        "--cluster=slurm",
        "--hparams_set=transformer_test",
        f"--output_dir={run}",
        "--train_steps=2",
    )
    assert_user_error(result, "t2t-trainer", "SLURM_PROCID is not set")
    assert not run.exists()


def _free_port_pair():
    """A port p with p + 1 free too: one node's two tasks."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def _trainer_args(run, port, program=TRAINER):
    """The shared TWO_WORKER_RUN's first 4 micro-steps (tests/support/workers.py):
    its checkpoint of step 4 is the reference's, since transformer_test's learning
    rate does not read train_steps (test_the_reference_holds_for_a_shorter_run)."""
    extra = ("--cluster=slurm", f"--cluster_port={port}")
    return trainer_args(run, train_steps=4, program=program, extra=extra)


def test_the_reference_holds_for_a_shorter_run():
    """A run of 4 micro-steps equals the first 4 of TWO_WORKER_RUN's 12 only while
    no learning-rate factor reads train_steps."""
    hp = HPARAMS_SETS.get("transformer_test")()
    factors = {f.strip() for f in hp.learning_rate_schedule.split("*")}
    assert factors and not factors & set(TRAIN_STEPS_FACTORS)


@pytest.mark.slow
def test_two_srun_tasks_train_as_one_two_worker_cluster(tmp_path, two_worker_reference):
    """Two tasks of one step on one node ("localhost"), TF_CONFIG unset: worker 0 and
    worker 1 on consecutive ports, 2 replicas in all, both holding the state a
    TF_CONFIG cluster of the same run has at that step."""
    run, port = tmp_path / "run", _free_port_pair()
    envs = [
        srun_env(i, SLURM_LOCALID=str(i), SLURM_NODEID="0", SLURMD_NODENAME="localhost")
        for i in range(2)
    ]
    codes = finish(
        launch_workers(_trainer_args(run, port), str(tmp_path), cluster_env=envs)
    )
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    for i, log in enumerate(logs):
        assert (
            f"cluster: SLURM job 4242 step 0, 2 task(s) on localhost (port "
            f"{port}-{port + 1}); this is worker {i} (localhost:{port + i})"
        ) in log
    assert "2 replicas = 256 tokens/update (simulating 4 GPUs)" in logs[0]
    assert "Final eval at step 4 (update 2)" in logs[0]
    assert "worker done at step 4" in logs[1]
    assert_workers_agree(run, 4)  # worker 1's own checkpoint: a multi-worker run
    assert_same_state(run, two_worker_reference, 4)


@pytest.mark.slow
def test_a_taken_port_stops_the_cli_before_tensorflow_starts(tmp_path, monkeypatch):
    """Without the check, TensorFlow's traceback says "Could not start gRPC server"."""
    for name, value in srun_env(0, SLURM_LOCALID="0").items():
        monkeypatch.setenv(name, value)
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_cli_subprocess(
            "trainer",
            *_trainer_args(tmp_path / "run", port, program=()),
            timeout=120,
        )
    assert_user_error(
        result, "t2t-trainer", f"port {port} of this task", "--cluster_port"
    )
    assert not (tmp_path / "run").exists()
