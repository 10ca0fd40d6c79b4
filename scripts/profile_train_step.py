"""Profile: where the wall time of a t2t-trainer run goes, per micro-step.

Runs the real training loop, Trainer.train(), unmodified, with TrainerOptions like
configs/quickstart_reverse.flags (transformer_tiny_fake_gpu4 on algorithmic_reverse,
2000 micro-steps, save and eval every 500) in a temporary output_dir; times its parts
through the Trainer's callbacks (`on_input`, `on_step`, `on_save`, `on_evaluate`):

  start-up        Trainer construction: problem data, model, optimizer, TrainStep
  first input     the first wait for a training batch (fills the shuffle buffer)
  trace accumulate / trace update
                  the first call of TrainStep.accumulate / accumulate_and_update
                  (tf.function tracing), told apart by is_update_micro_step
  input wait      the other waits for the next training batch
  step accumulate / step update
                  the other step calls: Python dispatch + the compiled step
  save / evaluate checkpoint writes and dev-set evaluations, the first apart
  loop rest       train() wall time minus all of the above: iterators, restore,
                  meter, log lines, TensorBoard writes, the Python loop

Then micro-measurements put the per-micro-step numbers in context: the step fed by the
live pipeline vs the same batches from memory (the harness's table; --json writes its
rows, the parts above and the rest), float() on a step output (the cost of a host sync
per micro-step, which the loop avoids: its meter keeps tensors until a log line), the
fixed cost of calling a tf.function with the step's input signature (Python
dispatch), the input pipeline alone, and (--op_stats_steps) a table of TF op types from
the TF profiler.

--profiler=pyinstrument (pip install pyinstrument; not a t2t_lite dependency) or
--profiler=cprofile additionally profiles the train() call and prints the call tree or
the top functions. To try a fix, run with PYTHONPATH at an edited copy of the
package (the script prints which t2t_lite it imported).

Run (from the repository root; ~2 min on 2 idle cores):

  python scripts/profile_train_step.py [--profiler=pyinstrument]
  python scripts/profile_train_step.py --train_steps=400 --save_checkpoints_steps=200 \\
      --local_eval_frequency=200
"""

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time

import tensorflow as tf
from absl import logging
from benchkit import builds, harness, profiler

import t2t_lite
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--problem", default="algorithmic_reverse")
    add("--hparams_set", default="transformer_tiny_fake_gpu4")
    add("--hparams", default="")
    add("--train_steps", type=int, default=2000)
    add("--save_checkpoints_steps", type=int, default=500)
    add("--local_eval_frequency", type=int, default=500)
    add("--eval_steps", type=int, default=0)
    add("--log_steps", type=int, default=250)
    add(
        "--output_dir", default="", help="Default: a temporary dir, deleted at the end."
    )
    add("--profiler", choices=("none", "pyinstrument", "cprofile"), default="none")
    add("--profile_out", default="", help="pyinstrument: also write an HTML report.")
    add(
        "--op_stats_steps",
        type=int,
        default=40,
        help="Step calls traced by the TF profiler for the op-type table; 0: skip.",
    )
    add(
        "--interference_chunk",
        type=int,
        default=40,
        help="Micro-steps per chunk of the live-pipeline vs in-memory comparison "
        "(a multiple of n keeps the accumulate/update mix equal).",
    )
    add(
        "--pipeline_batches",
        type=int,
        default=500,
        help="Batches for the input-pipeline-alone measurement.",
    )
    harness.add_json_flag(p)
    return p.parse_args(argv)


# --- timing callbacks ----------------------------------------------------------------


class PhaseTimer:
    """A Trainer callback: named lists of durations in seconds, each phase's first
    call (tracing, buffers filling, first checkpoint) under "<phase> (1st)"."""

    def __init__(self):
        self.samples = collections.defaultdict(list)
        self.is_update = None  # set to the run's TrainStep.is_update_micro_step

    def add(self, name, seconds):
        self.samples[name].append(seconds)

    def add_first_apart(self, name, seconds):
        first = f"{name} (1st)"
        self.add(name if self.samples[first] else first, seconds)

    def total(self, name):
        return sum(self.samples.get(name, ()))

    def count(self, name):
        return len(self.samples.get(name, ()))

    # The Trainer's callback interface.

    def on_input(self, seconds):
        self.add_first_apart("input wait", seconds)

    def on_step(self, step, seconds):
        kind = "update" if self.is_update(step) else "accumulate"
        self.add_first_apart(f"step {kind}", seconds)

    def on_save(self, seconds):
        self.add_first_apart("save", seconds)

    def on_evaluate(self, seconds):
        self.add_first_apart("evaluate", seconds)


# --- the run -------------------------------------------------------------------------


def make_trainer(args, output_dir, timer):
    hp = builds.hparams(args.hparams_set, args.hparams)
    options = TrainerOptions(
        problem=args.problem,
        model="transformer",
        output_dir=output_dir,
        train_steps=args.train_steps,
        eval_steps=args.eval_steps,
        local_eval_frequency=args.local_eval_frequency,
        save_checkpoints_steps=args.save_checkpoints_steps,
        log_steps=args.log_steps,
    )
    t0 = time.perf_counter()
    trainer = Trainer(options, hp, callbacks=[timer])
    timer.add("start-up", time.perf_counter() - t0)
    timer.is_update = trainer.step.is_update_micro_step
    return trainer


def train(trainer, timer, args):
    """trainer.train(), timed as a whole (and profiled, if asked); the callbacks
    time its parts."""
    python_profiler = profiler.start_python_profiler(args.profiler)
    t0 = time.perf_counter()
    try:
        record = trainer.train()
    finally:
        timer.add("train()", time.perf_counter() - t0)
        profiler.stop_python_profiler(python_profiler, args.profiler)
    if python_profiler is not None:
        profiler.print_python_profile(python_profiler, args.profiler, args.profile_out)
    return record


# --- micro-measurements --------------------------------------------------------------


def _median_call_seconds(fn, calls):
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def float_cost(trainer, batch):
    """Seconds for one float() of a step output: a host sync."""
    out = trainer.step.accumulate(batch)
    value = tf.nest.flatten(out["loss_sum"])[0]  # may be one tensor per replica
    return _median_call_seconds(lambda: float(value), 2000)


def dispatch_cost(batch):
    """Seconds to call a tf.function with the step's signature and an empty body."""
    empty = tf.function(
        lambda b: {"loss_sum": tf.constant(0.0), "tokens": tf.constant(0.0)},
        input_signature=builds.batch_signature(),
    )
    empty(batch)
    return _median_call_seconds(lambda: empty(batch), 2000)


def pipeline_interference(trainer, chunks, chunk_steps, start_step):
    """Per chunk, the median step-call ms when fed by the live input pipeline (its
    threads work while the step runs) and when replaying the very same batches from
    memory right after (the pipeline's prefetch buffer is full then, so it idles)."""
    iterator = iter(trainer.dataset("train", training=True, seed=2))
    times = {"in-memory batches": [], "live pipeline": []}
    step = start_step
    for chunk in range(chunks + 1):  # the first chunk warms up
        consumed = []
        for source in ("live pipeline", "in-memory batches"):
            calls = []
            for i in range(chunk_steps):
                if source == "live pipeline":
                    consumed.append(next(iterator))
                t0 = time.perf_counter()
                builds.micro_step(trainer.step, consumed[i], step)
                calls.append(1e3 * (time.perf_counter() - t0))
                step += 1
            if chunk:
                times[source].append(statistics.median(calls))
    return times


def op_type_stats(trainer, steps, start_step):
    """{op type: self seconds per micro-step} of `steps` step calls, from the TF
    profiler, or None if this TF has no xspace converter (it is TF's internal one:
    the TensorBoard profile plugin is not installed)."""
    iterator = iter(trainer.dataset("train", training=True, seed=3))
    batches = [next(iterator) for _ in range(steps)]
    del iterator
    return profiler.step_op_stats(trainer.step, batches, start_step)[0]


def pipeline_alone(trainer, batches):
    """Seconds per batch of the training input pipeline with nothing else running."""
    iterator = iter(trainer.dataset("train", training=True, seed=1))
    next(iterator)  # fills the shuffle buffer
    for _ in range(20):
        next(iterator)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - t0) / batches


# --- report --------------------------------------------------------------------------


def report(timer, args):
    """The time of each part of the loop (PhaseTimer), per call and per micro-step;
    returns its rows."""
    steps = args.train_steps
    loop = timer.total("train()")
    parts = [
        "input wait (1st)",
        "step accumulate (1st)",
        "step update (1st)",
        "input wait",
        "step accumulate",
        "step update",
        "save (1st)",
        "save",
        "evaluate (1st)",
        "evaluate",
    ]
    names = {  # the report's names for the first calls
        "input wait (1st)": "first input",
        "step accumulate (1st)": "trace accumulate",
        "step update (1st)": "trace update",
    }
    accounted = sum(timer.total(p) for p in parts)
    rows = [("start-up (Trainer())", timer.total("start-up"), 1)]
    rows += [(names.get(p, p), timer.total(p), timer.count(p)) for p in parts]
    rows.append(("loop rest", loop - accounted, steps))
    total = timer.total("start-up") + loop
    print(
        f"\n{steps} micro-steps, {args.hparams_set} on {args.problem}; "
        f"{harness.environment()}"
    )
    print_phases(rows, steps, total)
    return [{"part": n, "seconds": t, "calls": c} for n, t, c in rows]


def print_phases(rows, steps, total):
    """The table of where the time went: (name, seconds, calls) rows."""
    header = (
        f"{'part':<22} {'calls':>6} {'total s':>8} {'ms/call':>9} "
        f"{'ms/micro-step':>13} {'share':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, seconds, calls in rows:
        print(
            f"{name:<22} {calls:>6} {seconds:>8.2f} "
            f"{1e3 * seconds / max(calls, 1):>9.2f} {1e3 * seconds / steps:>13.3f} "
            f"{100 * seconds / total:>5.1f}%"
        )
    print("-" * len(header))
    print(
        f"{'total (start-up+train)':<22} {'':>6} {total:>8.2f} {'':>9} "
        f"{1e3 * total / steps:>13.3f} 100.0%"
    )


def print_micro_measurements(extras, args):
    """The harness's table of the step call fed live vs from memory, then the other
    micro-measurements; --json writes that table's rows and the rest."""
    chunk = args.interference_chunk
    rows = harness.summary_rows(extras["interference"], "in-memory batches")
    title = "step call fed by the live pipeline vs the same batches replayed"
    note = (
        f"{len(rows[0]['rounds'])} chunks of {chunk} micro-steps, live then from "
        "memory; median per chunk, then over chunks; ratio: median of the per-chunk "
        "ratios"
    )
    harness.print_table(title, rows, "ms/step call", "in-memory batches", note=note)
    print(
        f"float() of one step output       {1e3 * extras['float']:.4f} ms "
        f"(a host sync; the loop does one per log line, not per micro-step)"
    )
    print(
        f"empty tf.function call, same sig {1e3 * extras['dispatch']:.3f} ms "
        f"(Python dispatch floor of a step call)"
    )
    print(f"input pipeline alone             {1e3 * extras['pipeline']:.3f} ms/batch")
    others = {k: extras[k] for k in ("float", "dispatch", "pipeline")}
    harness.write_json(
        args.json,
        "profile_train_step",
        rows,
        "ms/step call",
        "in-memory batches",
        phases=extras["phases"],
        seconds=others,
    )


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.set_verbosity(logging.WARNING)
    print(f"t2t_lite imported from {os.path.dirname(t2t_lite.__file__)}")
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="t2t_profile_")
    timer = PhaseTimer()
    try:
        trainer = make_trainer(args, output_dir, timer)
        record = train(trainer, timer, args)
        print(
            f"final eval: loss {record['loss']:.4f}, accuracy {record['accuracy']:.4f}"
        )
        batch = next(iter(trainer.dataset("train", training=True, seed=1)))
        extras = {
            "interference": pipeline_interference(
                trainer, 5, args.interference_chunk, args.train_steps
            ),
            "float": float_cost(trainer, batch),
            "dispatch": dispatch_cost(batch),
            "pipeline": pipeline_alone(trainer, args.pipeline_batches),
        }
        extras["phases"] = report(timer, args)
        print_micro_measurements(extras, args)
        if args.op_stats_steps > 0:
            start = args.train_steps + 12 * args.interference_chunk
            totals = op_type_stats(trainer, args.op_stats_steps, start)
            if totals is None:
                print("\nno TF op table: this TF has no xspace converter")
            else:
                profiler.print_op_type_stats(totals)
    finally:
        if not args.output_dir:
            shutil.rmtree(output_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
