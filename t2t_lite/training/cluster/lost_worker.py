"""A lost worker in a multi-host run: one line every survivor stops with, and a
restart from the same step on every worker.

When a worker's process dies (killed, out of memory, its machine gone), TensorFlow's
coordination service notices the missing heartbeat (training/cluster/distribution.py sets
its timeout) and aborts the collectives of every other worker. What reaches Python
is an UnavailableError (or Cancelled/Aborted/DeadlineExceeded/Internal) whose text
names a collective op and, usually, the task that stopped sending heartbeats. Here
it becomes a WorkerLost: which worker was lost, the newest checkpoint every worker
has, and what to run to resume — instead of a raw "[[{{node CollectiveReduceV2}}]]"
or a save error that would blame the output directory.
"""

import re

from absl import logging

from t2t_lite.errors import UserError
from t2t_lite.outputs import run_files
from t2t_lite.outputs.checkpoints import checkpoints_on_disk
from t2t_lite.training.cluster.distribution import gather_workers

_TASK = re.compile(r"/job:(chief|worker)/replica:\d+/task:(\d+)")


class WorkerLost(UserError):
    """Another worker of the run is gone; this one stopped (exit status 2)."""


def lost_tasks(error, own):
    """The tasks ("worker 1", "chief 0") the error's text names, other than `own`
    (this process's (type, index)), in order of appearance."""
    found = []
    for job, index in _TASK.findall(str(error)):
        task = (job, int(index))
        if task != own and task not in found:
            found.append(task)
    return [f"{job} {index}" for job, index in found]


def newest_common_step(output_dir, workers):
    """The newest checkpoint step that every worker's directory holds, or None."""
    common = None
    for worker in range(workers):
        directory = run_files.worker_checkpoint_dir(output_dir, worker)
        steps = {step for step, _ in checkpoints_on_disk(directory)}
        common = steps if common is None else common & steps
    return max(common) if common else None


def worker_lost(error, own, output_dir, workers, step):
    """The WorkerLost that replaces a peer failure `error` at micro-step `step`."""
    # A worker whose heartbeats to the leader time out is not told which task is
    # gone; of two workers, it can only be the other one.
    names = lost_tasks(error, own) or [
        "the other worker" if workers == 2 else "another worker"
    ]
    common = newest_common_step(output_dir, workers)
    where = (
        f"the newest checkpoint every worker has is step {common}"
        if common is not None
        else "no checkpoint is on every worker yet (a rerun starts from step 0)"
    )
    noticed = " (it stopped sending heartbeats)" if "heartbeat" in str(error) else ""
    return WorkerLost(
        f"{' and '.join(names)} of the run was lost{noticed} at step {step}; "
        f"{where}; run the same command on every worker to resume."
    )


def restore_common_step(setup, path):
    """Every worker of a multi-host run resumes from the same step, or none
    does: collectives would otherwise pair up different micro-steps, silently.
    `setup`: the TrainerSetup; returns the path restored in the end.

    Each worker has restored its newest readable checkpoint (`path`, its own
    directory); one all-gather compares the steps. If they differ (a worker
    was killed mid-save, or its newest checkpoint is damaged), every worker
    restores the oldest of them; a worker that cannot makes every worker stop
    with one line, before anything trains."""
    mine = int(setup.step.micro_step) if path else 0
    steps = gather_workers(setup.strategy, mine)
    target = min(steps)
    if len(set(steps)) == 1:
        return path
    found = ", ".join(f"worker {i}: {s}" for i, s in enumerate(steps))
    if target == 0:
        none = ", ".join(f"worker {i}" for i, s in enumerate(steps) if s == 0)
        raise UserError(
            f"the workers' newest checkpoints differ ({found}): {none} has no "
            "readable checkpoint; nothing was trained: restore its checkpoints "
            "(OUTPUT_DIR/workers/worker-I) or use a new output_dir."
        )
    able = 1
    if mine != target:
        root = setup.parts.checkpoint() if setup.input_pipeline_changed else None
        path = setup.checkpoints.restore_newest_readable(root, at_most=target)
        able = int(path is not None and int(setup.step.micro_step) == target)
    ables = gather_workers(setup.strategy, able)
    if not all(ables):
        unable = ", ".join(f"worker {i}" for i, a in enumerate(ables) if not a)
        raise UserError(
            f"the workers' newest checkpoints differ ({found}) and {unable} "
            f"cannot restore step {target}, the newest one every worker has; "
            "nothing was trained: restore the missing checkpoints or use a new "
            "output_dir."
        )
    logging.warning(
        "The workers' newest checkpoints differ (%s): every worker resumes from "
        "step %d.",
        found,
        target,
    )
    return path
