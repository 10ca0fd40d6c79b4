"""The TF profiler's time per op type, for bench_step.py and profile_train_step.py."""

import collections
import glob
import json
import os
import shutil
import tempfile

import tensorflow as tf


def op_type_stats(run_steps, steps):
    """{op type: self seconds per step} while `run_steps()` runs `steps` steps under
    the TF profiler, or None if this TF has no xspace converter (it is TF's internal
    one: the TensorBoard profile plugin is not installed). Warm up before calling."""
    try:
        from tensorflow.python.profiler.internal import (
            _pywrap_profiler_plugin as plugin,
        )
    except ImportError:
        return None
    logdir = tempfile.mkdtemp(prefix="t2t_tfprof_")
    try:
        tf.profiler.experimental.start(logdir)
        run_steps()
        tf.profiler.experimental.stop()
        paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        data, _ = plugin.xspace_to_tools_data(paths, "framework_op_stats", {})
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    table = json.loads(data)[0]
    ids = [c["id"] for c in table["cols"]]
    totals = collections.Counter()
    for row in table["rows"]:
        cells = dict(zip(ids, [c.get("v") if c else None for c in row["c"]]))
        totals[cells["type"]] += cells["total_self_time"] * 1e-6 / steps
    return totals
