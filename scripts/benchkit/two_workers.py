"""Two-worker clusters on 127.0.0.1 for the multi-host benchmarks
(bench_lost_worker.py, bench_multiworker_save.py): ports, each worker's TF_CONFIG,
and the checkpointed state two runs are compared by."""

import json
import os
import socket

import numpy as np


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_environments(count=2):
    """os.environ plus TF_CONFIG for each worker of a new cluster of `count`."""
    cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(count)]}
    return [
        dict(
            os.environ,
            TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            ),
        )
        for index in range(count)
    ]


def state(prefix):
    """Every tensor of checkpoint `prefix` but the input iterators (each worker's
    own)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if not key.startswith(("train_iterator", "_CHECKPOINTABLE"))
    }


def max_relative_difference(a, b):
    """The largest |a - b| / |b| over the tensors of two states."""
    worst = 0.0
    for key in b:
        x, y = np.asarray(a[key], np.float64), np.asarray(b[key], np.float64)
        scale = np.maximum(np.abs(y), 1e-12)
        worst = max(worst, float(np.max(np.abs(x - y) / scale, initial=0.0)))
    return worst
