"""Which devices and machines a run trains on: one tf.distribute strategy for all.

- No TF_CONFIG, `worker_gpu` <= 1: the default strategy (one device).
- No TF_CONFIG, `worker_gpu` = N > 1: MirroredStrategy over N local GPUs; on a machine
  without GPUs the CPU is split into N logical devices (for trying it out and tests).
- TF_CONFIG naming more than one worker: MultiWorkerMirroredStrategy, TensorFlow's
  collective all-reduce between hosts (and over each host's local GPUs).

`configure_devices` must run before TensorFlow initializes its devices (before the
first op): only then can the CPU still be split.
"""

import json
import os

import tensorflow as tf

from t2t_lite.errors import UserError


def cluster_workers():
    """Number of workers TF_CONFIG declares (0 without a usable TF_CONFIG)."""
    raw = os.environ.get("TF_CONFIG", "")
    if not raw:
        return 0
    try:
        config = json.loads(raw)
        workers = config.get("cluster", {}).get("worker", [])
        chief = config.get("cluster", {}).get("chief", [])
    except (json.JSONDecodeError, AttributeError) as e:
        raise UserError(f"TF_CONFIG is not valid JSON with a cluster: {e}.") from None
    return len(workers) + len(chief)


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


def make_strategy(worker_gpu=1, cross_device_ops=None):
    """The strategy for this process (see the module docstring)."""
    if cluster_workers() > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    devices = configure_devices(worker_gpu)
    if not devices:
        return tf.distribute.get_strategy()
    if cross_device_ops is None and devices[0].startswith("/cpu"):
        cross_device_ops = tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)


def _cluster(strategy):
    """(task type, task id, {job: [addresses]}) of a multi-worker strategy, or None."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return None
    return resolver.task_type, resolver.task_id or 0, resolver.cluster_spec().as_dict()


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


def is_chief(strategy):
    """Whether this process writes the run's files."""
    return worker_index(strategy) == 0
