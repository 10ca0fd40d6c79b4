"""The TF profiler's time per op type (of any steps, or of TrainStep micro-steps),
for bench_step.py and profile_train_step.py,
and profile_train_step.py's Python profilers (pyinstrument, cProfile)."""

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


def step_op_stats(step, batches, first_step, warm_up=True):
    """op_type_stats of one pass of micro-steps over `batches` (a TrainStep's,
    numbered from `first_step`), after a warm-up pass on the same shapes (skip it
    when they are traced already). Returns (stats or None, the next step number)."""
    from benchkit import builds

    if warm_up:
        for batch in batches:
            builds.micro_step(step, batch, first_step)
            first_step += 1

    def run_steps():
        for i, batch in enumerate(batches):
            builds.micro_step(step, batch, first_step + i)

    return op_type_stats(run_steps, len(batches)), first_step + len(batches)


def print_op_type_stats(totals, top=12):
    """The `top` op types of op_type_stats by self time, and the idle time."""
    busy = sum(v for k, v in totals.items() if k != "IDLE")
    print(
        f"\nTF op self time per micro-step, summed over threads (profiler on): "
        f"{1e3 * busy:.1f} ms busy, {1e3 * totals.get('IDLE', 0.0):.1f} ms IDLE"
    )
    for name, seconds in totals.most_common():
        if name == "IDLE":
            continue
        if top <= 0:
            break
        top -= 1
        print(f"  {name:<28} {1e3 * seconds:7.2f} ms {100 * seconds / busy:5.1f}%")


def start_python_profiler(kind):
    """A started Python profiler of `kind` ("pyinstrument", "cprofile"), or None."""
    if kind == "pyinstrument":
        import pyinstrument  # pylint: disable=import-outside-toplevel

        profiler = pyinstrument.Profiler(interval=0.001)
        profiler.start()
        return profiler
    if kind == "cprofile":
        import cProfile  # pylint: disable=import-outside-toplevel

        profiler = cProfile.Profile()
        profiler.enable()
        return profiler
    return None


def stop_python_profiler(profiler, kind):
    if kind == "pyinstrument":
        profiler.stop()
    elif kind == "cprofile":
        profiler.disable()


def print_python_profile(profiler, kind, html_path=""):
    """pyinstrument's call tree (and an HTML report to `html_path`), or cProfile's
    top 40 functions by cumulative time."""
    if kind == "pyinstrument":
        print(profiler.output_text(unicode=True, color=False, show_all=False))
        if html_path:
            with open(html_path, "w") as f:
                f.write(profiler.output_html())
    elif kind == "cprofile":
        import pstats  # pylint: disable=import-outside-toplevel

        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
