"""Which devices and machines a run trains on: one tf.distribute strategy for all.

- No TF_CONFIG, `worker_gpu` <= 1: the default strategy (one device).
- No TF_CONFIG, `worker_gpu` = N > 1: MirroredStrategy over N local GPUs; on a machine
  without GPUs the CPU is split into N logical devices (for trying it out and tests).
- TF_CONFIG naming more than one worker: MultiWorkerMirroredStrategy, TensorFlow's
  collective all-reduce between hosts (and over each host's local GPUs), with the
  coordination service's heartbeat timeout set so that a lost worker ends the others
  (training/lost_worker.py words it).

TF_CONFIG is checked here, at the boundary (read_tf_config): TensorFlow itself
ignores some mistakes (a task index beyond a one-task cluster trains alone, into the
shared output_dir) and answers others with a traceback.

`configure_devices` must run before TensorFlow initializes its devices (before the
first op): only then can the CPU still be split.
"""

import json
import os

import tensorflow as tf
from absl import logging

from t2t_lite.errors import UserError
from t2t_lite.graph import graph_function

_JOBS = ("chief", "worker")


class Cluster:
    """TF_CONFIG, checked: the jobs ({"chief": [...], "worker": [...]}, only those
    two: MultiWorkerMirroredStrategy's), this process's task type and index."""

    def __init__(self, jobs, task_type, task_index):
        self.jobs, self.task_type, self.task_index = jobs, task_type, task_index

    @property
    def workers(self):
        return sum(len(addresses) for addresses in self.jobs.values())

    def describe_task(self):
        return f"{self.task_type} {self.task_index}"


def read_tf_config(raw=None):
    """The checked TF_CONFIG (a Cluster), or None when it is unset or empty.

    Every mistake is one UserError line before anything is written: TensorFlow
    would otherwise ignore some (an index beyond a one-worker cluster trains alone,
    into the shared output_dir) and raise a traceback for others."""
    raw = os.environ.get("TF_CONFIG", "") if raw is None else raw
    if not raw.strip():
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UserError(f"TF_CONFIG is not valid JSON: {e}.") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise UserError('TF_CONFIG must be a JSON object with a "cluster" object.')
    jobs = {}
    seen = {}
    for job, addresses in config["cluster"].items():
        if job not in _JOBS:
            raise UserError(
                f"TF_CONFIG: unknown job type {job!r} in the cluster (t2t_lite "
                "trains with 'chief' and 'worker' tasks only)."
            )
        if isinstance(addresses, str):
            addresses = [addresses]
        if not isinstance(addresses, list) or not all(
            isinstance(a, str) and a.strip() for a in addresses
        ):
            raise UserError(
                f'TF_CONFIG: cluster "{job}" must be a list of "host:port" '
                f"addresses, got {addresses!r}."
            )
        for index, address in enumerate(addresses):
            if address in seen:
                raise UserError(
                    f"TF_CONFIG: address {address} is given twice ({seen[address]} "
                    f"and {job} {index}); every task needs its own host:port."
                )
            seen[address] = f"{job} {index}"
        jobs[job] = addresses
    if len(jobs.get("chief", [])) > 1:
        raise UserError(
            f"TF_CONFIG: a cluster has at most one chief, got {len(jobs['chief'])}."
        )
    if not any(jobs.values()):
        raise UserError('TF_CONFIG: the cluster has no "chief" or "worker" task.')
    task = config.get("task")
    if not isinstance(task, dict):
        raise UserError(
            'TF_CONFIG needs "task": {"type": "worker", "index": I} naming this '
            "process."
        )
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in jobs:
        raise UserError(
            f"TF_CONFIG: task type {task_type!r} is not a job of the cluster "
            f"({', '.join(sorted(jobs))})."
        )
    if isinstance(index, bool) or not isinstance(index, int):
        raise UserError(f"TF_CONFIG: task index must be an integer, got {index!r}.")
    if not 0 <= index < len(jobs[task_type]):
        raise UserError(
            f"TF_CONFIG: task index {index} is outside the cluster's "
            f"{len(jobs[task_type])} {task_type} task(s) (0 to "
            f"{len(jobs[task_type]) - 1})."
        )
    return Cluster(jobs, task_type, index)


def cluster_workers():
    """Number of workers TF_CONFIG declares (0 without TF_CONFIG); a malformed
    TF_CONFIG is a UserError (read_tf_config)."""
    cluster = read_tf_config()
    return cluster.workers if cluster else 0


def configure_devices(worker_gpu):
    """Splits the CPU into `worker_gpu` logical devices when there is no GPU.

    Returns the local device names to mirror over ([] for the default strategy).
    """
    if worker_gpu < 0:
        raise UserError(f"worker_gpu must be >= 0, got {worker_gpu}.")
    gpus = tf.config.list_physical_devices("GPU")
    if worker_gpu <= 1:
        return []
    if gpus:
        if len(gpus) < worker_gpu:
            raise UserError(
                f"worker_gpu={worker_gpu} but this machine has {len(gpus)} GPU(s)."
            )
        return [f"/gpu:{i}" for i in range(worker_gpu)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * worker_gpu
        )
    except RuntimeError:  # devices already initialized (e.g. a second run in-process)
        pass
    logical = tf.config.list_logical_devices("CPU")
    if len(logical) < worker_gpu:
        raise UserError(
            f"worker_gpu={worker_gpu}: TensorFlow already started with "
            f"{len(logical)} CPU device(s); split the CPU before the first op."
        )
    return [f"/cpu:{i}" for i in range(worker_gpu)]


def make_strategy(worker_gpu=1, cross_device_ops=None, lost_worker_timeout=30):
    """The strategy for this process (see the module docstring).

    lost_worker_timeout: seconds after which a worker that stopped answering (its
    process killed, its machine gone) counts as lost, through the coordination
    service's heartbeat; every other worker's next collective then fails instead
    of waiting for it forever. Collectives themselves get no timeout: the other
    workers wait at one while the chief evaluates, however long that takes.
    """
    cluster = read_tf_config()
    if cluster and cluster.workers > 1:
        _configure_heartbeat(cluster, lost_worker_timeout)
        return tf.distribute.MultiWorkerMirroredStrategy()
    if cluster:
        logging.info(
            "TF_CONFIG names one task (%s): training on this host alone.",
            cluster.describe_task(),
        )
    devices = configure_devices(worker_gpu)
    if not devices:
        return tf.distribute.get_strategy()
    if cross_device_ops is None and devices[0].startswith("/cpu"):
        cross_device_ops = tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)


def _configure_heartbeat(cluster, timeout):
    """The coordination service MultiWorkerMirroredStrategy would configure (the
    same leader and jobs), with the heartbeat timeout set: configured first, it is
    the one the strategy uses."""
    if timeout <= 0:
        raise UserError(f"lost_worker_timeout must be > 0 seconds, got {timeout}.")
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return  # already configured in this process (a second run in-process)
    spec = tf.train.ClusterSpec(cluster.jobs)
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=int(timeout * 1000),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(tasks))
            for job, tasks in cluster.jobs.items()
            if tasks
        ],
    )


def _cluster(strategy):
    """(task type, task id, {job: [addresses]}) of a multi-worker strategy, or None."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return None
    return resolver.task_type, resolver.task_id or 0, resolver.cluster_spec().as_dict()


def task(strategy):
    """(task type, index) of this process in its cluster; ("worker", 0) alone."""
    cluster = _cluster(strategy)
    return ("worker", 0) if cluster is None else cluster[:2]


def num_workers(strategy):
    """Processes taking part in the run (1 on a single host)."""
    cluster = _cluster(strategy)
    if cluster is None:
        return 1
    jobs = cluster[2]
    return max(len(jobs.get("chief", [])) + len(jobs.get("worker", [])), 1)


def worker_index(strategy):
    """This process's rank: 0 for the chief (or the first worker when there is no
    chief), counting workers after it, in TensorFlow's replica order."""
    cluster = _cluster(strategy)
    if cluster is None:
        return 0
    task_type, task_id, jobs = cluster
    if task_type == "chief":
        return 0
    return task_id + len(jobs.get("chief", []))


def gather_workers(strategy, value):
    """[value of worker 0, of worker 1, ...]: an integer from every worker of the
    run, by one all-gather (every worker must call it, in the same order)."""
    local = max(strategy.num_replicas_in_sync // num_workers(strategy), 1)
    mine = tf.constant([int(value)], tf.int64)

    @graph_function
    def gather():
        def replica():
            return tf.distribute.get_replica_context().all_gather(mine, axis=0)

        return strategy.run(replica)

    gathered = strategy.experimental_local_results(gather())[0].numpy()
    return [int(v) for v in gathered[::local]]


def is_chief(strategy):
    """Whether this process writes the run's files."""
    return worker_index(strategy) == 0
