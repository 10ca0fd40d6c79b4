"""Which devices and machines a run trains on: one tf.distribute strategy for all.

- No cluster, `worker_gpu` <= 1: the default strategy (one device).
- No cluster, `worker_gpu` = N > 1: MirroredStrategy over N local GPUs; on a machine
  without GPUs the CPU is split into N logical devices (for trying it out and tests).
- A cluster of more than one worker: MultiWorkerMirroredStrategy, TensorFlow's
  collective all-reduce between hosts (and over each host's local GPUs), with the
  coordination service's heartbeat timeout set so that a lost worker ends the others
  (training/cluster/lost_worker.py words it).

The cluster comes from TF_CONFIG or from the SLURM job step srun started this process
in (training/cluster/slurm.py), as `cluster_source` says (resolve_cluster). Either way it is
checked here, at the boundary (read_tf_config): TensorFlow itself ignores some
mistakes (a task index beyond a one-task cluster trains alone, into the shared
output_dir) and answers others with a traceback. A SLURM cluster is written to
TF_CONFIG in this process, so that what follows is the TF_CONFIG path, unchanged.

`configure_devices` must run before TensorFlow initializes its devices (before the
first op): only then can the CPU still be split.
"""

import json
import os
import socket

import tensorflow as tf
from absl import logging

from t2t_lite.errors import UserError
from t2t_lite.graph import graph_function
from t2t_lite.training.cluster import slurm

_JOBS = ("chief", "worker")
CLUSTER_SOURCES = ("auto", "tf_config", "slurm", "none")


class Cluster:
    """TF_CONFIG, checked: the jobs ({"chief": [...], "worker": [...]}, only those
    two: MultiWorkerMirroredStrategy's), this process's task type and index, and
    where they came from (for the start-up line)."""

    def __init__(self, jobs, task_type, task_index):
        self.jobs, self.task_type, self.task_index = jobs, task_type, task_index
        self.origin = self._tf_config_origin()
        self.tf_config = None  # the TF_CONFIG to set, when it was not the source

    def _tf_config_origin(self):
        addresses = [a for tasks in self.jobs.values() for a in tasks]
        hosts = list(dict.fromkeys(a.rsplit(":", 1)[0] for a in addresses))
        shown = ",".join(hosts[:4]) + (
            f",... ({len(hosts)} hosts)" if hosts[4:] else ""
        )
        return f"TF_CONFIG, {len(addresses)} task(s) on {shown}"

    @property
    def address(self):
        return self.jobs[self.task_type][self.task_index]

    @property
    def workers(self):
        return sum(len(addresses) for addresses in self.jobs.values())

    def describe_task(self):
        return f"{self.task_type} {self.task_index}"

    def describe(self):
        """The start-up line."""
        return (
            f"cluster: {self.origin}; this is {self.describe_task()} ({self.address})"
        )


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
    jobs = _checked_jobs(config["cluster"])
    task_type, index = _checked_task(config.get("task"), jobs)
    return Cluster(jobs, task_type, index)


def _checked_jobs(cluster):
    """TF_CONFIG's "cluster": {job: [addresses]} of chief and worker tasks, each
    address once."""
    jobs = {}
    seen = {}
    for job, addresses in cluster.items():
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
    return jobs


def _checked_task(task, jobs):
    """TF_CONFIG's "task": (type, index) of a task that `jobs` has."""
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
    return task_type, index


def resolve_cluster(source="auto", port_base=slurm.DEFAULT_PORT, environ=None):
    """The checked Cluster this process belongs to, or None to train on this host.

    source: "tf_config" (TF_CONFIG, which must be set), "slurm" (the SLURM step srun
    started this task in), "none" (this host alone, whatever is set) or "auto":
    TF_CONFIG when it is set (the explicit choice), else a SLURM step of more than
    one task, else none. port_base: a SLURM node's first port (training/cluster/slurm.py)."""
    environ = os.environ if environ is None else environ
    if source not in CLUSTER_SOURCES:
        raise UserError(
            f"cluster must be one of {', '.join(CLUSTER_SOURCES)}, got {source!r}."
        )
    if source == "none":
        return None
    given = read_tf_config(environ.get("TF_CONFIG", ""))
    if source == "tf_config" and given is None:
        raise UserError(
            "--cluster=tf_config but TF_CONFIG is not set (or empty); set it on "
            "every worker, or choose --cluster=slurm or --cluster=none."
        )
    if source == "tf_config" or (source == "auto" and given is not None):
        return given
    if source == "auto" and not slurm.is_multi_task_step(environ):
        return None
    step = slurm.SlurmStep(environ, port_base)
    raw = json.dumps(step.tf_config())
    cluster = read_tf_config(raw)  # the checks a user's TF_CONFIG gets
    cluster.origin, cluster.tf_config = step.describe(), raw
    if given is not None and (given.jobs, given.describe_task()) != (
        cluster.jobs,
        cluster.describe_task(),
    ):
        raise UserError(
            f"TF_CONFIG and --cluster=slurm disagree: TF_CONFIG makes this task "
            f"{given.describe_task()} ({given.address}) of {given.workers}, SLURM "
            f"{cluster.describe_task()} ({cluster.address}) of {cluster.workers}; "
            "unset TF_CONFIG, or use --cluster=tf_config to follow it."
        )
    return cluster


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


def make_strategy(
    worker_gpu=1,
    cross_device_ops=None,
    lost_worker_timeout=30,
    cluster_source="auto",
    cluster_port=slurm.DEFAULT_PORT,
):
    """The strategy for this process (see the module docstring).

    cluster_source, cluster_port: where the cluster comes from (resolve_cluster).
    lost_worker_timeout: seconds after which a worker that stopped answering (its
    process killed, its machine gone) counts as lost, through the coordination
    service's heartbeat; every other worker's next collective then fails instead
    of waiting for it forever. Collectives themselves get no timeout: the other
    workers wait at one while the chief evaluates, however long that takes.
    """
    cluster = resolve_cluster(cluster_source, cluster_port)
    if cluster and cluster.workers > 1:
        logging.info("%s", cluster.describe())
        if cluster.tf_config:
            os.environ["TF_CONFIG"] = cluster.tf_config  # what the strategy reads
        _configure_coordination(cluster, lost_worker_timeout)
        return tf.distribute.MultiWorkerMirroredStrategy()
    if cluster:
        logging.info(
            "%s names one task (%s): training on this host alone.",
            cluster.origin.split(",")[0],
            cluster.describe_task(),
        )
    devices = configure_devices(worker_gpu)
    if not devices:
        return tf.distribute.get_strategy()
    if cross_device_ops is None and devices[0].startswith("/cpu"):
        cross_device_ops = tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)


def check_port_free(cluster):
    """This task's port can be listened on here. TensorFlow's server binds it on
    every interface; when it is taken (another job's worker on a shared node),
    MultiWorkerMirroredStrategy() fails with "UnknownError: Could not start gRPC
    server", a traceback that names no port."""
    port = cluster.address.rsplit(":", 1)[-1]
    if not port.isdigit():
        return  # not a port: TensorFlow names the address
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT: free
        try:
            probe.bind(("", int(port)))
        except OSError as e:
            hint = (
                "choose another first port with --cluster_port"
                if cluster.origin.startswith("SLURM")
                else "give this task another port in TF_CONFIG"
            )
            raise UserError(
                f"port {port} of this task ({cluster.describe_task()}, "
                f"{cluster.address}) cannot be used on this host ({e.strerror}): "
                f"another process holds it; {hint}."
            ) from None


def _configure_coordination(cluster, timeout):
    """The coordination service MultiWorkerMirroredStrategy would configure (the
    same leader and jobs), with the heartbeat timeout set: configured first, it is
    the one the strategy uses. This task's port is checked first."""
    if timeout <= 0:
        raise UserError(f"lost_worker_timeout must be > 0 seconds, got {timeout}.")
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return  # already configured in this process (a second run in-process)
    check_port_free(cluster)
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
