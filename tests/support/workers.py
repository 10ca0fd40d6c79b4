"""Two-worker clusters on 127.0.0.1 for the multi-host tests, and the one
uninterrupted two-worker run they all compare with.

The stop-and-resume (test_distributed.py), lost-worker (test_lost_worker.py) and
SLURM (test_slurm.py) tests train the same small run, TWO_WORKER_RUN; each ends with
the state the uninterrupted run has at the same step (conftest.py's
`two_worker_reference` trains it once per session). Sharing it is what makes "resumes
exactly" a claim about the run rather than about the workers agreeing with each other.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from support import forked

# Checkpoints every 4 micro-steps (2 updates of n=2), 12 in all; --deterministic so
# that runs of it agree to float tolerance whatever interrupted them.
TWO_WORKER_RUN = (
    "--hparams_set=transformer_test",
    "--hparams=batch_size=64,max_length=16,optimizer_multistep_accumulate_steps=2",
    "--log_steps=1",
    "--save_checkpoints_steps=4",
    "--local_eval_frequency=0",
    "--eval_steps=1",
    "--deterministic",
)
TWO_WORKER_STEPS = 12
TRAINER = (sys.executable, "-m", "t2t_lite.bin.trainer")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_args(output_dir, train_steps=TWO_WORKER_STEPS, program=TRAINER, extra=()):
    """The command line of TWO_WORKER_RUN into output_dir."""
    return [
        *program,
        *TWO_WORKER_RUN,
        f"--output_dir={output_dir}",
        f"--train_steps={train_steps}",
        *extra,
    ]


def launch_workers(args, log_dir, extra_env=({}, {}), cluster_env=None):
    """Runs command `args` as the two workers of one cluster on 127.0.0.1 (each
    with its TF_CONFIG, or cluster_env[i] instead, and extra_env[i]), logging to
    log_dir/workerI.log."""
    if cluster_env is None:
        cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
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
            forked.popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    return workers


def finish(workers, timeout=240):
    return [w.wait(timeout=timeout) for w in workers]


def worker_logs(log_dir):
    return [open(os.path.join(log_dir, f"worker{i}.log")).read() for i in range(2)]


def newest_step(directory):
    steps = [
        int(name[len("model-") : -len(".index")])
        for name in os.listdir(directory)
        if name.startswith("model-") and name.endswith(".index")
    ]
    return max(steps, default=None)


def checkpointed_state(prefix):
    """Every checkpointed tensor but the input iterators (each worker's own)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return {
        key: np.asarray(reader.get_tensor(key))
        for key in reader.get_variable_to_shape_map()
        if not key.startswith(("train_iterator", "_CHECKPOINTABLE"))
    }


def assert_workers_agree(run, step):
    """The chief's checkpoint and worker 1's hold the same state, bitwise."""
    chief = checkpointed_state(os.path.join(run, f"model-{step}"))
    other = checkpointed_state(
        os.path.join(run, "workers", "worker-1", f"model-{step}")
    )
    assert chief.keys() == other.keys() and len(chief) > 50
    for key in chief:  # weights, slots, accumulators, counters
        assert (chief[key] == other[key]).all(), key


def assert_same_state(run, reference, step):
    """The chief's checkpoint of `step` in `run` holds what the reference run's
    does, to design.md §2.2's tolerance (rtol 1e-5, atol 1e-7: the collectives
    of two launches need not add in the same order). The save counter is left
    out: a stop's extra save is not training state."""
    got = checkpointed_state(os.path.join(run, f"model-{step}"))
    expected = checkpointed_state(os.path.join(reference, f"model-{step}"))
    assert got.keys() == expected.keys() and len(expected) > 50
    for key in [k for k in expected if not k.startswith("save_counter")]:
        np.testing.assert_allclose(
            got[key], expected[key], rtol=1e-5, atol=1e-7, err_msg=key
        )


def train_reference(root):
    """TWO_WORKER_RUN trained uninterrupted into root/run (logs in root); returns
    the run's directory. A failure or a hang kills both workers, so that nothing
    keeps writing into a reference another attempt would build."""
    output_dir = os.path.join(root, "run")
    workers = launch_workers(trainer_args(output_dir), root)
    try:
        codes = finish(workers)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    if codes != [0, 0]:
        logs = worker_logs(root)
        raise RuntimeError(
            f"the two-worker reference run failed: {codes}\n"
            + logs[0][-2000:]
            + logs[1][-2000:]
        )
    return output_dir
