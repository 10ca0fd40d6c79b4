"""Benchmark: the memory of one training step, and the largest micro-batch that fits a
memory budget, for t2t_lite with and without activation recomputation and for the
Keras 3 + keras-hub peer, side by side.

Configurations (--configs, all by default):

  t2t_f32        t2t_lite's TrainStep (build_training, the trainer's own assembly), float32.
  t2t_recompute  the same with hparam recompute_grad=true (each encoder and decoder
                 layer recomputed in the backward pass, models/recompute.py).
  keras_f32      the Keras 3 + keras-hub encoder-decoder of bench_peers.py
                 (keras_transformer, built and compiled by bench_peers.KerasSession:
                 keras.optimizers.Adam(gradient_accumulation_steps=2), label-smoothed
                 loss), trained with model.fit on the same batches.
  opennmt        OpenNMT-tf: not measured by this script (its TensorFlow 2.12 runs in
                 its own virtual environment, bench_peers.py --setup_opennmt); the
                 report says whether that environment exists.

The model: --layers encoder and decoder layers (6) of transformer_base width (hidden
512, filter 2048, 8 heads, dropout 0.1, label smoothing 0.1), one shared vocabulary of
--vocab_size ids (8000; shared embeddings and softmax), float32. A micro-batch of T
tokens is T / --length sentences of exactly --length tokens (64) on both sides, all
non-pad (ids cut from bench_peers.synthetic_pairs' Zipf-distributed token stream).
A training step is one accumulate micro-step followed by one update micro-step (n=2,
with accumulators): t2t_lite's step.accumulate then step.accumulate_and_update; for
Keras, two model.fit steps, the first of which only adds into Adam's accumulators.

Memory is TensorFlow's CPU allocator's byte count: before each micro-step
tf.config.experimental.reset_memory_stats("CPU:0"), after it
tf.config.experimental.get_memory_info("CPU:0")["peak"]; the step's peak is the larger
of its two micro-steps' peaks (each starts from what the previous one left live).
"live" is the allocator's in-use bytes just before the step: weights, Adam slots,
accumulators and whatever else the framework keeps between steps (counters, the
batch); "peak - live" is what the step itself adds (activations, gradients,
temporaries). TF keeps CPU allocator statistics only in a BFC allocator, so every
child runs with TF_CPU_ALLOCATOR_USE_BFC=true; the report names the allocator the
children's TensorFlow logged creating ("bfc_cpu_allocator_for_gpu": TF's BFC CPU
allocator, which that variable selects whether or not oneDNN is on; "mklcpu":
oneDNN's, used without the variable when oneDNN is on) and whether oneDNN is on.
The allocator counts the chunks tensors occupy (rounded up) and nothing outside TF's
allocator (the Python heap, graph and kernel caches, TF's runtime): RSS is larger.

Each configuration runs in a FRESH child process of this script (--child=...), with
--rounds rounds interleaved in a rotating order (benchlib.interleave). A child builds
its model, trains one untimed warm-up step at the smallest size (tracing; Keras's
dataset has a [None, None] signature, so model.fit traces once for every size), then
measures one step at each --micro_batches size, smallest first, and --time_windows
steps in all at --time_tokens (for the step time).

Breakdown (every config; weights, slots and accumulators computed from the
variables' shapes): weights = the trainable variables, slots = Adam's m and v,
accumulators = the gradient accumulators (t2t_lite: step.accumulator; Keras: Adam's
own), "other live" = live - those three (the allocator's rounding of chunks, the
batch, counters), activations = peak - live. Keras's live bytes after an update are
below its variables' bytes, and about one accumulator set higher after an accumulate
micro-step: its reset assigns zeros (constants its graph keeps), which the
accumulators apparently share until the next micro-step writes them. Its step's
peak, reached after they are written, counts them; its "activations" include that
re-materialization.

The largest micro-batch under --budget_gb (GB = 10^9 bytes, as t2t-trainer's
--memory_budget): in the last round's child of each --fit_configs entry, after its
measured steps, a search over the number of sentences of --length tokens, one
training step per probe (reset_memory_stats before each micro-step, same process):
a count fits when the step's allocator peak is within the budget. The search
(`search`) keeps a bracket (largest count known to fit, smallest known not to) and
ends when both the answer and the next count have been probed. Each probe is placed
where the line through the child's two largest measured sizes predicts the budget,
starting from the probe nearest to it (so an accurate line needs two probes: the
answer and one more), and it bisects the bracket when that stops halving it. Plain
bisection from a bracket found by galloping took 16 probes for t2t_recompute (28 min
of steps of up to 25k tokens) in a trial run; this search took 3 in the run of
docs/benchmarks.md. Identical steps peak up to ~3% apart (TF's inter-op threads run
the ops in varying orders, and the allocator rounds chunks), so the answer is that
precise: a few sentences for t2t_recompute, about one for the others. The probe list
is printed.

Step time: wall-clock and process CPU time (time.process_time: all threads) per
micro-step over the --time_windows steps at --time_tokens (the memory-measured step
included), per round; reported: the medians over rounds and the medians of the
per-round ratios t2t_recompute / t2t_f32. Both are timed in the same round but in
different processes one after the other, so other load on the machine that comes
and goes skews the wall-clock ratio; the CPU-time ratio is less sensitive to it.

The auto-fit: t2t_lite's own probe, training.opening.auto_batch.probe_batch_size, as the
trainer calls it for batch_size=0 (on the run itself, built with one sentence per
micro-batch; --budget_gb, headroom 0.1, max_length --length, an effective_batch_size
far above the answer), in a fresh child per --autofit_configs entry (everything
live in the process counts against the budget). It probes the update micro-step
only, on 1, 2, 4, ... sentences of --length tokens, then bisects, so its
largest_sentences should agree with the search above to about a sentence (its
batch_size counts --length + 1 tokens per sentence); probe_seconds includes tracing
the step, not building the run.

Run (from the repository root):

  nice -n 5 python scripts/bench_fit.py         # 6+6 layers, 2 rounds: ~15 min on 2
                                                # cores (14.4 min with another job on
                                                # them), longer when heavily shared
  python scripts/bench_fit.py --smoke           # tiny model, every path: < 1 min

The last line printed is a JSON summary; --json writes everything.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

import bench_peers
import benchlib
import numpy as np

CONFIGS = ("t2t_f32", "t2t_recompute", "keras_f32", "opennmt")
MEASURED = ("t2t_f32", "t2t_recompute", "keras_f32")
MIB = 2**20
GB = 10**9
SMOKE = {  # --smoke: a tiny model, one round, every path
    "hidden_size": 32,
    "filter_size": 64,
    "num_heads": 2,
    "layers": 1,
    "vocab_size": 200,
    "length": 16,
    "micro_batches": "64,128,256",
    "time_tokens": 256,
    "time_windows": 1,
    "rounds": 1,
    "budget_gb": 0.002,
}
# TF keeps CPU allocator statistics only in a BFC allocator; the log says which.
CHILD_ENV = {
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "bfc_allocator=1",
}
ALLOCATORS = {
    "bfc_cpu_allocator_for_gpu": "TF's BFC CPU allocator (TF_CPU_ALLOCATOR_USE_BFC)",
    "mklcpu": "oneDNN's mklcpu allocator",
}


# --- arguments -----------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--smoke", action="store_true", help="Tiny model, 1 round: under a minute.")
    add("--configs", default=",".join(CONFIGS), help=f"Subset of {CONFIGS}.")
    add("--rounds", type=int, default=2, help="Interleaved rounds (medians).")
    add("--layers", type=int, default=6, help="Encoder and decoder layers (each).")
    add("--hidden_size", type=int, default=512)
    add("--filter_size", type=int, default=2048)
    add("--num_heads", type=int, default=8)
    add("--dropout", type=float, default=0.1)
    add("--vocab_size", type=int, default=8000)
    add("--length", type=int, default=64, help="Tokens per sentence, both sides.")
    add(
        "--micro_batches",
        default="1024,2048,4096",
        help="Micro-batch sizes in tokens (multiples of --length).",
    )
    add("--time_tokens", type=int, default=4096, help="Micro-batch of item 4.")
    add("--time_windows", type=int, default=2, help="Steps timed at --time_tokens.")
    add("--budget_gb", type=float, default=2.5, help="Memory budget (10^9 bytes).")
    add(
        "--fit_configs",
        default="t2t_f32,t2t_recompute,keras_f32",
        help='Configs whose largest micro-batch is searched ("" for none).',
    )
    add(
        "--autofit_configs",
        default="t2t_f32",
        help='t2t configs probed by probe_batch_size ("" for none).',
    )
    add("--max_sentences", type=int, default=4096, help="The search's upper bound.")
    add("--venv", default=bench_peers.DEFAULT_VENV, help="OpenNMT-tf venv.")
    add("--json", default="", help="Also write all results here.")
    add("--seed", type=int, default=1)
    add("--child", default="", help=argparse.SUPPRESS)
    add("--fit", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    args.configs = split(args.configs)
    args.fit_configs = split(args.fit_configs)
    args.autofit_configs = split(args.autofit_configs)
    args.micro_batches = sorted(int(t) for t in split(args.micro_batches))
    if not args.configs or set(args.configs) - set(CONFIGS):
        p.error(f"--configs: choose from {', '.join(CONFIGS)}.")
    if set(args.fit_configs) - set(MEASURED):
        p.error(f"--fit_configs: choose from {', '.join(MEASURED)}.")
    if set(args.autofit_configs) - {"t2t_f32", "t2t_recompute"}:
        p.error("--autofit_configs: choose from t2t_f32, t2t_recompute.")
    if not args.micro_batches or any(t % args.length for t in args.micro_batches):
        p.error("--micro_batches: token counts, each a multiple of --length.")
    if args.time_tokens not in args.micro_batches or args.time_windows < 1:
        p.error("--time_tokens must be one of --micro_batches; --time_windows >= 1.")
    return args


def split(text):
    return [x.strip() for x in str(text).split(",") if x.strip()]


def spec_of(args):
    """The model and batching every child builds (bench_peers' spec keys)."""
    return {
        "hidden_size": args.hidden_size,
        "filter_size": args.filter_size,
        "num_layers": args.layers,
        "num_heads": args.num_heads,
        "vocab_size": args.vocab_size,
        "dropout": args.dropout,
        "label_smoothing": 0.1,
        "batch_size": max(args.micro_batches),
        "max_tokens": args.length,
        "accumulate_steps": 2,
        "seed": args.seed,
    }


def child_args(args, child, fit=False):
    """This script's command line for a child."""
    shared = (
        "layers",
        "hidden_size",
        "filter_size",
        "num_heads",
        "dropout",
        "vocab_size",
        "length",
        "time_tokens",
        "time_windows",
        "budget_gb",
        "max_sentences",
        "seed",
    )
    flags = [f"--{name}={getattr(args, name)}" for name in shared]
    flags.append("--micro_batches=" + ",".join(map(str, args.micro_batches)))
    return [__file__, f"--child={child}", *flags] + (["--fit"] if fit else [])


# --- in a child: data and memory ------------------------------------------------------


def sentence_ids(sentences, length, vocab_size, seed):
    """[sentences, length] int32 ids, none of them pad (0): bench_peers.synthetic_pairs'
    token stream (Zipf ids, EOS 1 where its sentences end), cut into rows."""
    count = max(8, 2 * sentences)
    while True:
        pairs = bench_peers.synthetic_pairs(count, vocab_size, length, length, seed)
        stream = np.concatenate([ids for pair in pairs for ids in pair])
        if stream.size >= sentences * length:
            return stream[: sentences * length].reshape(sentences, length)
        count *= 2


def batch_of(sentences, args):
    """A micro-batch as the train step takes it (numpy): source and target rows."""
    ids = sentence_ids(2 * sentences, args.length, args.vocab_size, args.seed)
    return {"inputs": ids[:sentences], "targets": ids[sentences:]}


def allocator():
    """(in-use bytes, peak bytes) of TF's CPU allocator."""
    import tensorflow as tf

    info = tf.config.experimental.get_memory_info("CPU:0")
    return info["current"], info["peak"]


def reset_peak():
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats("CPU:0")


def variable_bytes(variables):
    import tensorflow as tf

    return sum(
        int(tf.TensorShape(v.shape).num_elements()) * tf.as_dtype(v.dtype).size
        for v in variables
    )


def optimizer_parts(optimizer):
    """(Adam slot variables, accumulator variables, other variables) of a Keras
    optimizer, by variable path."""
    slots, accumulators, other = [], [], []
    for v in optimizer.variables:
        path = v.path
        if path.endswith(("_momentum", "_velocity")):
            slots.append(v)
        elif "gradient_accumulator" in path:
            accumulators.append(v)
        else:
            other.append(v)
    return slots, accumulators, other


# --- in a child: the configurations ---------------------------------------------------


class T2TConfig:
    """t2t_lite's TrainStep with n=2, float32; recompute_grad for t2t_recompute."""

    def __init__(self, name, spec):
        hp = bench_peers.t2t_hparams(spec, "float32").override(
            recompute_grad=name == "t2t_recompute"
        )
        self.run = benchlib.build_seeded_run(
            hp, spec["vocab_size"], 100000, spec["seed"]
        )
        self.step = self.run.step

    def state(self):
        slots, _, other = optimizer_parts(self.run.optimizer)
        return {
            "weights": variable_bytes(self.run.model.trainable_variables),
            "slots": variable_bytes(slots),
            "accumulators": variable_bytes(self.step.accumulator.variables),
            "optimizer_other": variable_bytes(other),
        }

    def prepare(self, batch):
        import tensorflow as tf

        return {k: tf.constant(v) for k, v in batch.items()}

    def window(self, batch):
        """One step (accumulate, then update) on `batch`; per micro-step records."""
        records = []
        for kind, function in (
            ("accumulate", self.step.accumulate),
            ("update", self.step.accumulate_and_update),
        ):
            live = allocator()[0]
            reset_peak()
            start, cpu = time.perf_counter(), time.process_time()
            out = function(batch)
            float(out["loss_sum"][0])  # on a CPU the call returns when done; to be sure
            seconds = time.perf_counter() - start
            cpu_seconds = time.process_time() - cpu
            current, peak = allocator()
            records.append(
                {
                    "kind": kind,
                    "live": live,
                    "peak": peak,
                    "after": current,
                    "seconds": seconds,
                    "cpu_seconds": cpu_seconds,
                }
            )
        return records


class KerasConfig:
    """bench_peers' Keras peer: built and compiled by KerasSession, trained with
    model.fit, two steps per call (Adam's gradient_accumulation_steps=2)."""

    def __init__(self, name, spec, args):
        import keras

        self.session = bench_peers.KerasSession(
            name, spec, [batch_of(1, args), batch_of(1, args)]
        )
        self.model = self.session.model
        self.optimizer = self.model.optimizer
        self.n = spec["accumulate_steps"]
        self.records = []
        outer = self

        class Probe(keras.callbacks.Callback):
            """Resets the allocator's peak before each fit step, reads it after."""

            def on_train_batch_begin(self, batch, logs=None):
                micro_step = int(outer.optimizer._iterations.numpy())  # micro-steps
                kind = "update" if (micro_step + 1) % outer.n == 0 else "accumulate"
                live = allocator()[0]
                reset_peak()
                outer.records.append({"kind": kind, "live": live})
                outer.started = time.perf_counter(), time.process_time()

            def on_train_batch_end(self, batch, logs=None):
                seconds = time.perf_counter() - outer.started[0]
                cpu_seconds = time.process_time() - outer.started[1]
                current, peak = allocator()
                outer.records[-1].update(
                    peak=peak, after=current, seconds=seconds, cpu_seconds=cpu_seconds
                )

        self.probe = Probe()

    def state(self):
        if not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)
        slots, accumulators, other = optimizer_parts(self.optimizer)
        return {
            "weights": variable_bytes(self.model.trainable_variables),
            "slots": variable_bytes(slots),
            "accumulators": variable_bytes(accumulators),
            "optimizer_other": variable_bytes(other),
        }

    def prepare(self, batch):
        """A two-step dataset of `batch` with a [None, None] signature (so that
        model.fit traces once for every size), as KerasSession makes its data."""
        import tensorflow as tf

        examples = bench_peers.keras_examples([batch, batch])

        def spec_of(array):
            return tf.TensorSpec([None, None], tf.as_dtype(array.dtype))

        return tf.data.Dataset.from_generator(
            lambda: iter(examples),
            output_signature=tf.nest.map_structure(spec_of, examples[0]),
        )

    def window(self, data):
        self.records = []
        self.model.fit(
            data, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[self.probe]
        )
        if [r["kind"] for r in self.records] != ["accumulate", "update"]:
            raise RuntimeError(f"Keras steps out of phase: {self.records}")
        return self.records


def build_config(name, spec, args):
    if name.startswith("keras"):
        return KerasConfig(name, spec, args)
    return T2TConfig(name, spec)


def step_record(micro):
    """A step's numbers from its two micro-step records."""
    return {
        "live": micro[0]["live"],
        "peak": max(m["peak"] for m in micro),
        "seconds": sum(m["seconds"] for m in micro),
        "cpu_seconds": sum(m["cpu_seconds"] for m in micro),
        "micro": micro,
    }


def search(measure, budget, guess, slope, cap):
    """The largest r <= cap whose measure(r) (a step's peak bytes on r sentences)
    is within `budget`, 0 if none; returns (r, {probed r: peak}).

    A bracket [low, high): low fits (0: none known), high does not (cap + 1: none
    known). Each probe is the largest r that the probe nearest the budget predicts
    to fit, with `slope` bytes per sentence (from the measured steps; None: from
    the two probes farthest apart, doubling after the first), kept strictly inside
    the bracket; when both ends are known and the bracket has not halved in
    two probes, the probe is its middle instead (bisection). It ends when high =
    low + 1: the answer and the next count were both probed. While no count is
    known not to fit, probes stay at most one sentence above a prediction, so the
    search never runs a step far beyond the budget."""
    peaks = {}
    low, high = 0, cap + 1
    candidate = min(max(1, guess), cap)
    widths = []
    while True:
        peaks[candidate] = measure(candidate)
        if peaks[candidate] <= budget:
            low = candidate
        else:
            high = candidate
        if high - low <= 1:
            return low, peaks
        if slope is None and len(peaks) > 1:  # no measured line: the probes' own
            a, b = min(peaks), max(peaks)
            per = (peaks[b] - peaks[a]) / (b - a)
            step_slope = per if per > 0 else None
        else:
            step_slope = slope
        nearest = min(peaks, key=lambda r: abs(peaks[r] - budget))
        if step_slope is None:  # one probe and no line yet: double
            candidate = 2 * nearest
        else:
            candidate = nearest + int((budget - peaks[nearest]) // step_slope)
        widths.append(high - low)
        known = 0 < low and high <= cap
        if known and len(widths) >= 3 and widths[-1] > widths[-3] / 2:
            candidate = (low + high) // 2
        candidate = min(max(candidate, low + 1), high - 1)


def prediction(steps, budget, length):
    """(sentences, bytes per sentence) that the straight line through the two
    largest measured (tokens, peak) pairs predicts for `budget`; None if fewer
    than two sizes were measured or the line does not rise. (The smallest sizes
    can sit off the line: there the update's model-sized temporaries, not the
    activations, make the peak.)"""
    points = sorted((s["tokens"], s["peak"]) for s in steps)[-2:]
    if len(points) < 2 or points[0][0] == points[1][0]:
        return None
    (t0, p0), (t1, p1) = points
    per_token = (p1 - p0) / (t1 - t0)
    if per_token <= 0:
        return None
    return int((t1 + (budget - p1) / per_token) // length), per_token * length


def child_steps(args, name):
    """A configuration's steps at every --micro_batches size; with --fit, then the
    search for the largest micro-batch under --budget_gb."""
    started = time.perf_counter()
    spec = spec_of(args)
    config = build_config(name, spec, args)
    built = time.perf_counter() - started
    length = args.length
    sizes = [t // length for t in args.micro_batches]
    warm = time.perf_counter()
    config.window(config.prepare(batch_of(sizes[0], args)))
    result = {
        "config": name,
        "build_seconds": built,
        "warmup_seconds": time.perf_counter() - warm,
        "state": config.state(),
        "steps": [],
        "timed": [],
        "timed_cpu": [],
    }
    for sentences in sizes:
        data = config.prepare(batch_of(sentences, args))
        tokens = sentences * length
        windows = args.time_windows if tokens == args.time_tokens else 1
        for w in range(windows):
            record = step_record(config.window(data))
            if w == 0:
                result["steps"].append({"tokens": tokens, **record})
            if tokens == args.time_tokens:
                result["timed"].append(record["seconds"])
                result["timed_cpu"].append(record["cpu_seconds"])
        del data
    if args.fit:
        budget = args.budget_gb * GB
        guess, slope = prediction(result["steps"], budget, length) or (1, None)
        probes = []

        def measure(sentences):
            data = config.prepare(batch_of(sentences, args))
            record = step_record(config.window(data))
            del record["micro"]
            probes.append({"sentences": sentences, **record})
            return record["peak"]

        largest, _ = search(measure, budget, guess, slope, args.max_sentences)
        result["fit"] = {
            "budget_bytes": budget,
            "predicted": guess,
            "largest_sentences": largest,
            "largest_tokens": largest * length,
            "probes": probes,
        }
    result["seconds"] = time.perf_counter() - started
    print(json.dumps(result))


def child_autofit(args, name):
    """probe_batch_size under --budget_gb, alone in this process."""
    from t2t_lite.optim.batch_plan import largest_micro_batch
    from t2t_lite.training.opening.auto_batch import probe_batch_size

    started = time.perf_counter()
    spec = spec_of(args)
    hp = bench_peers.t2t_hparams(spec, "float32").override(
        recompute_grad=name == "t2t_recompute",
        batch_size=0,
        effective_batch_size=32 * max(args.micro_batches),
        optimizer_multistep_accumulate_steps=1,
        max_length=args.length,
    )
    # The probe runs on the run itself, built with one sentence per micro-batch.
    provisional = hp.copy().override(batch_size=args.length + 1)
    run = benchlib.build_seeded_run(
        provisional, spec["vocab_size"], 100000, spec["seed"]
    )
    found = probe_batch_size(
        run,
        memory_budget_gb=args.budget_gb,
        headroom=0.1,
        tokens_per_update=largest_micro_batch(hp, 1),
    )
    result = {
        "config": name,
        "batch_size": found.batch_size,
        "sentences": found.sentences,
        "largest_sentences": found.largest_sentences,
        "max_length": found.max_length,
        "limit": found.limit,
        "probe_seconds": found.probe_seconds,
        "probes": found.probes,
        "line": found.line(),
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result))


# --- in the parent: running -----------------------------------------------------------


def logged_allocator(stderr):
    """(allocator name, oneDNN on) from a child's TensorFlow log."""
    names = re.findall(r"Creating new BFCAllocator named: (\S+)", stderr)
    onednn = "oneDNN custom operations are on" in stderr
    return (names[0] if names else None), onednn


def run_child(args, child, fit=False):
    """(result, stderr) of one child, or ({"error": ...}, "")."""
    try:
        stdout, stderr = benchlib.run_python(child_args(args, child, fit), CHILD_ENV)
        return benchlib.last_json(stdout), stderr
    except (RuntimeError, ValueError, IndexError) as exc:
        lines = str(exc).strip().splitlines() or [""]
        return {"error": " | ".join(lines[-3:])[:600]}, ""


def measure(args):
    """{config: [step-child result per round]}, interleaved; the last round's
    child of each --fit_configs entry also searches; and the allocator seen."""
    measured = [c for c in args.configs if c in MEASURED]
    results = {c: [] for c in measured}
    seen = {"allocators": set(), "onednn": set()}

    def run_one(config, round_index):
        fit = round_index == args.rounds - 1 and config in args.fit_configs
        result, stderr = run_child(args, f"steps:{config}", fit)
        name, onednn = logged_allocator(stderr)
        if name:
            seen["allocators"].add(name)
            seen["onednn"].add(onednn)
        results[config].append(result)
        if "error" in result:
            print(f"round {round_index + 1} {config}: {result['error']}", flush=True)
            return
        peaks = ", ".join(
            f"{s['tokens']}: {s['peak'] / MIB:.0f}" for s in result["steps"]
        )
        line = f"round {round_index + 1} {config:<13} peak MiB {peaks}"
        if "fit" in result:
            f = result["fit"]
            line += (
                f"; fits {f['largest_sentences']} sentences "
                f"({len(f['probes'])} probes, predicted {f['predicted']})"
            )
        print(f"{line} ({result['seconds']:.0f}s)", flush=True)

    if measured:
        benchlib.interleave(measured, args.rounds, run_one)
    return results, seen


def autofit(args, seen):
    out = {}
    for config in args.autofit_configs:
        result, stderr = run_child(args, f"autofit:{config}")
        name, onednn = logged_allocator(stderr)
        if name:
            seen["allocators"].add(name)
            seen["onednn"].add(onednn)
        out[config] = result
        print(f"autofit {config}: {result.get('line', result.get('error'))}")
    return out


# --- in the parent: reporting ---------------------------------------------------------


def ok(results):
    return [r for r in results if "error" not in r]


def step_medians(results):
    """{tokens: {"live", "peak", "delta", "accumulate", "update"}} medians, bytes."""
    out = {}
    for tokens in sorted({s["tokens"] for r in ok(results) for s in r["steps"]}):
        steps = [s for r in ok(results) for s in r["steps"] if s["tokens"] == tokens]

        def med(key, steps=steps):
            return statistics.median(key(s) for s in steps)

        out[tokens] = {
            "live": med(lambda s: s["live"]),
            "peak": med(lambda s: s["peak"]),
            "delta": med(lambda s: s["peak"] - s["live"]),
            "accumulate_peak": med(lambda s: s["micro"][0]["peak"]),
            "update_peak": med(lambda s: s["micro"][1]["peak"]),
        }
    return out


def mib(x):
    """MiB with as many decimals as a small model needs."""
    x /= MIB
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def print_peaks(args, results, seen):
    print(
        f"\nPeak of one training step (accumulate + update micro-step), TF allocator "
        f"MiB, medians over {args.rounds} round(s); sentences of {args.length} "
        "tokens:\n"
    )
    print(
        "| config | micro-batch (tokens) | live before | peak | peak - live | "
        "peak of accumulate / update micro-step |"
    )
    print("|---|---|---|---|---|---|")
    table = {}
    for config, rs in results.items():
        if not ok(rs):
            print(f"| {config} | error: {rs[0]['error'][:200]} | | | | |")
            continue
        table[config] = step_medians(rs)
        for tokens, m in table[config].items():
            print(
                f"| {config} | {tokens} | {mib(m['live'])} | **{mib(m['peak'])}** | "
                f"{mib(m['delta'])} | {mib(m['accumulate_peak'])} / "
                f"{mib(m['update_peak'])} |"
            )
    if "opennmt" in args.configs:
        print(f"| opennmt | {opennmt_status(args)} | | | | |")
    names = sorted(seen["allocators"]) or ["unknown (not in the children's log)"]
    described = ", ".join(
        f"{n} ({ALLOCATORS.get(n, 'a BFC allocator')})" for n in names
    )
    onednn = {True: "on", False: "off"}.get(next(iter(seen["onednn"]), None), "?")
    print(
        f"\nallocator: {described}; oneDNN {onednn} (TF_ENABLE_ONEDNN_OPTS="
        f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')})"
    )
    return table, names, onednn


def opennmt_status(args):
    if os.path.exists(bench_peers.opennmt_main(args.venv)):
        return (
            f"not measured: a venv exists at {args.venv}, but this script has no "
            "OpenNMT-tf memory driver"
        )
    return f"not available: no OpenNMT-tf venv at {args.venv}"


def print_breakdown(results, table):
    if not table:
        return {}
    print(
        "\nBreakdown, MiB (weights, slots, accumulators from the variables' shapes; "
        "other live = live before - those; activations = peak - live before):\n"
    )
    print(
        "| config | micro-batch | weights | Adam slots (m, v) | accumulators | "
        "other live | activations | peak |"
    )
    print("|---|---|---|---|---|---|---|---|")
    out = {}
    for config, rs in results.items():
        if config not in table:
            continue
        state = ok(rs)[0]["state"]
        fixed = state["weights"] + state["slots"] + state["accumulators"]
        out[config] = {"state": state, "per_tokens": {}}
        for tokens, m in table[config].items():
            other = m["live"] - fixed
            out[config]["per_tokens"][tokens] = {"other_live": other, **m}
            print(
                f"| {config} | {tokens} | {mib(state['weights'])} | "
                f"{mib(state['slots'])} | {mib(state['accumulators'])} | "
                f"{'+' if other >= 0 else ''}{mib(other)} | {mib(m['delta'])} | "
                f"{mib(m['peak'])} |"
            )
    return out


def fits_summary(args, results):
    out = {}
    for config, rs in results.items():
        fit = next((r["fit"] for r in ok(rs) if "fit" in r), None)
        if fit is None:
            continue
        at = [p for p in fit["probes"] if p["sentences"] == fit["largest_sentences"]]
        out[config] = {
            "largest_sentences": fit["largest_sentences"],
            "largest_tokens": fit["largest_tokens"],
            "peak_at_largest": at[0]["peak"] if at else None,
            "probes": len(fit["probes"]),
            "predicted": fit["predicted"],
            "probe_seconds": sum(p["seconds"] for p in fit["probes"]),
            "probe_list": [
                {**p, "fits": p["peak"] <= fit["budget_bytes"]} for p in fit["probes"]
            ],
        }
    return out


def print_fits(args, fits):
    if not fits:
        return
    print(
        f"\nLargest micro-batch whose training step peaks within --budget_gb "
        f"{args.budget_gb:g} GB ({args.budget_gb * GB / MIB:.0f} MiB), sentences of "
        f"{args.length} tokens (search in each config's last-round child):\n"
    )
    print(
        "| config | sentences | tokens | peak there (MiB) | vs keras_f32 | probes "
        "(predicted start) |"
    )
    print("|---|---|---|---|---|---|")
    keras = fits.get("keras_f32", {}).get("largest_tokens")
    for config, f in fits.items():
        ratio = f"{f['largest_tokens'] / keras:.2f}x" if keras else "-"
        peak = mib(f["peak_at_largest"]) if f["peak_at_largest"] else "-"
        print(
            f"| {config} | {f['largest_sentences']} | **{f['largest_tokens']}** | "
            f"{peak} | {ratio} | {f['probes']} ({f['predicted']}) |"
        )
    print()
    for config, f in fits.items():
        probes = ", ".join(
            f"{p['sentences']}: {mib(p['peak'])} {'fits' if p['fits'] else 'no'}"
            for p in f["probe_list"]
        )
        print(f"{config} probes (sentences: peak MiB): {probes}")


def recompute_summary(args, results, table):
    """Memory saving at every size and step time at --time_tokens."""
    if "t2t_f32" not in table or "t2t_recompute" not in table:
        return {}
    out = {"memory": {}, "time": {}}
    for tokens in table["t2t_f32"]:
        a, b = table["t2t_f32"][tokens], table["t2t_recompute"].get(tokens)
        if b:
            out["memory"][tokens] = {
                "peak_ratio": b["peak"] / a["peak"],
                "activation_ratio": b["delta"] / a["delta"],
                "saved_mib": (a["peak"] - b["peak"]) / MIB,
            }
    for key, field in (("wall", "timed"), ("cpu", "timed_cpu")):
        per_round = {
            config: [1000 * sum(r[field]) / (2 * len(r[field])) for r in ok(rs)]
            for config, rs in results.items()
        }
        ratios = [
            b / a for a, b in zip(per_round["t2t_f32"], per_round["t2t_recompute"])
        ]
        out["time"][key] = {
            "ms_per_micro_step": {
                c: statistics.median(v) for c, v in per_round.items() if v
            },
            "ms_per_micro_step_rounds": per_round,
            "recompute_ratio": statistics.median(ratios),
            "recompute_ratio_rounds": ratios,
        }
    out["time"]["tokens"] = args.time_tokens
    return out


def print_recompute(args, rec):
    if not rec:
        return
    print("\nRecomputation (t2t_recompute vs t2t_f32):\n")
    print("| micro-batch | peak ratio | activations ratio | saved MiB |")
    print("|---|---|---|---|")
    for tokens, m in rec["memory"].items():
        print(
            f"| {tokens} | {m['peak_ratio']:.3f} | {m['activation_ratio']:.3f} | "
            f"{m['saved_mib']:.0f} |"
        )
    t = rec["time"]
    print(f"\nStep time at {t['tokens']} tokens, ms per micro-step, median (rounds):\n")
    print("| | " + " | ".join(t["wall"]["ms_per_micro_step"]) + " | recompute / f32 |")
    print("|---|" + "---|" * (len(t["wall"]["ms_per_micro_step"]) + 1))
    for key, what in (("wall", "wall time"), ("cpu", "CPU time (process)")):
        rounds = t[key]["ms_per_micro_step_rounds"]
        row = " | ".join(
            f"{v:.0f} ({', '.join(f'{x:.0f}' for x in rounds[c])})"
            for c, v in t[key]["ms_per_micro_step"].items()
        )
        ratios = ", ".join(f"{r:.2f}" for r in t[key]["recompute_ratio_rounds"])
        print(f"| {what} | {row} | **{t[key]['recompute_ratio']:.2f}x** ({ratios}) |")


def print_autofit(args, found, fits):
    if not found:
        return
    print(f"\nAuto-fit, probe_batch_size under {args.budget_gb:g} GB, headroom 0.1:\n")
    print(
        "| config | batch_size | sentences | largest_sentences | search above | "
        "probes | probe_seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    for config, f in found.items():
        if "error" in f:
            print(f"| {config} | error: {f['error'][:200]} | | | | | |")
            continue
        mine = fits.get(config, {}).get("largest_sentences", "-")
        print(
            f"| {config} | {f['batch_size']} | {f['sentences']} | "
            f"{f['largest_sentences']} | {mine} | {f['probes']} | "
            f"{f['probe_seconds']:.1f} |"
        )


def goals(fits, rec):
    """The targets, each True/False (None when not measured); the step time's
    by wall clock and by CPU time."""
    keras = fits.get("keras_f32", {}).get("largest_tokens")
    f32 = fits.get("t2t_f32", {}).get("largest_tokens")
    recompute = fits.get("t2t_recompute", {}).get("largest_tokens")
    ratio = rec["time"]["wall"]["recompute_ratio"] if rec else None
    cpu_ratio = rec["time"]["cpu"]["recompute_ratio"] if rec else None
    return {
        "t2t_f32_fits_at_least_keras": None if not (keras and f32) else f32 >= keras,
        "t2t_recompute_fits_2x_keras": None
        if not (keras and recompute)
        else recompute >= 2 * keras,
        "t2t_recompute_step_time_at_most_1.35x": None
        if ratio is None
        else ratio <= 1.35,
        "t2t_recompute_cpu_time_at_most_1.35x": None
        if cpu_ratio is None
        else cpu_ratio <= 1.35,
    }


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        kind, name = args.child.split(":")
        (child_steps if kind == "steps" else child_autofit)(args, name)
        return
    started = time.perf_counter()
    benchlib.print_start()
    results, seen = measure(args)
    found = autofit(args, seen)
    print(f"\n{benchlib.environment()}")
    print(
        f"model: {args.layers}+{args.layers} layers, hidden {args.hidden_size}, "
        f"filter {args.filter_size}, {args.num_heads} heads, dropout {args.dropout}, "
        f"vocab {args.vocab_size}, float32, n=2"
    )
    table, allocators, onednn = print_peaks(args, results, seen)
    breakdown = print_breakdown(results, table)
    fits = fits_summary(args, results)
    print_fits(args, fits)
    rec = recompute_summary(args, results, table)
    print_recompute(args, rec)
    print_autofit(args, found, fits)
    met = goals(fits, rec)
    print("\ngoals: " + ", ".join(f"{k}: {v}" for k, v in met.items()))
    wall = time.perf_counter() - started
    print(
        f"\ntotal wall time {wall:.0f}s, load average at end {benchlib.load_average()}"
    )
    summary = {
        "benchmark": "bench_fit",
        "smoke": args.smoke,
        "allocator": allocators,
        "onednn": onednn,
        "budget_gb": args.budget_gb,
        "peak_mib": {
            c: {t: m["peak"] / MIB for t, m in rows.items()}
            for c, rows in table.items()
        },
        "live_mib": {
            c: {t: m["live"] / MIB for t, m in rows.items()}
            for c, rows in table.items()
        },
        "largest_tokens": {c: f["largest_tokens"] for c, f in fits.items()},
        "recompute_step_time_ratio": {
            k: rec["time"][k]["recompute_ratio"] for k in ("wall", "cpu")
        }
        if rec
        else None,
        "autofit": {
            c: {
                k: f.get(k)
                for k in ("batch_size", "largest_sentences", "probe_seconds")
            }
            for c, f in found.items()
        },
        "opennmt": opennmt_status(args) if "opennmt" in args.configs else None,
        "goals": met,
        "wall_seconds": round(wall),
    }
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "args": vars(args),
                    "summary": summary,
                    "breakdown": breakdown,
                    "recompute": rec,
                    "results": results,
                    "autofit": found,
                },
                out,
                indent=1,
                default=str,
            )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
