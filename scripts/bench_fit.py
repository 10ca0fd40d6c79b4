"""Benchmark: the memory of one training step, and the largest micro-batch that fits a
memory budget, for t2t_lite with and without activation recomputation and for the
Keras 3 + keras-hub peer, side by side.

Configurations (--configs, all by default):

  t2t_f32        t2t_lite's TrainStep (build_training, the trainer's own assembly), float32.
  t2t_recompute  the same with hparam recompute_grad=true (each encoder and decoder
                 layer recomputed in the backward pass, models/recompute.py).
  keras_f32      the Keras 3 + keras-hub encoder-decoder of bench_peers.py
                 (benchkit/peers/keras_peer.py, built and compiled by KerasSession:
                 keras.optimizers.Adam(gradient_accumulation_steps=2), label-smoothed
                 loss), trained with model.fit on the same batches.
  opennmt        OpenNMT-tf: not measured by this script (its TensorFlow 2.12 runs in
                 its own virtual environment, bench_peers.py --setup_opennmt); the
                 report says whether that environment exists.

The model: --layers encoder and decoder layers (6) of transformer_base width (hidden
512, filter 2048, 8 heads, dropout 0.1, label smoothing 0.1), one shared vocabulary of
--vocab_size ids (8000; shared embeddings and softmax), float32. A micro-batch of T
tokens is T / --length sentences of exactly --length tokens (64) on both sides, all
non-pad (ids cut from benchkit.peers.corpus.synthetic_pairs' Zipf-distributed token
stream).
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
--rounds rounds interleaved in a rotating order (benchkit.harness.interleave). A child builds
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
(benchkit/fit/search.py) keeps a bracket (largest count known to fit, smallest known not to) and
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
import sys
import time

from benchkit import harness
from benchkit.fit import report
from benchkit.fit.children import child_autofit, child_steps
from benchkit.memory import CHILD_ENV, MIB, logged_allocator
from benchkit.peers import opennmt

CONFIGS = ("t2t_f32", "t2t_recompute", "keras_f32", "opennmt")
MEASURED = ("t2t_f32", "t2t_recompute", "keras_f32")
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
    add("--venv", default=opennmt.DEFAULT_VENV, help="OpenNMT-tf venv.")
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


# --- in the parent: running -----------------------------------------------------------


def run_child(args, child, fit=False):
    """(result, stderr) of one child, or ({"error": ...}, "")."""
    try:
        stdout, stderr = harness.run_python(child_args(args, child, fit), CHILD_ENV)
        return harness.last_json(stdout), stderr
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
        harness.interleave(measured, args.rounds, run_one)
    return results, seen


def autofit(args, seen):
    """{config: t2t_lite's own auto-fit result}, a fresh child per config."""
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


# --- in the parent: the report --------------------------------------------------------


def print_report(args, results, found, seen):
    """Every table; returns what the summary needs from them."""
    print(f"\n{harness.environment()}")
    print(
        f"model: {args.layers}+{args.layers} layers, hidden {args.hidden_size}, "
        f"filter {args.filter_size}, {args.num_heads} heads, dropout {args.dropout}, "
        f"vocab {args.vocab_size}, float32, n=2"
    )
    table, allocators, onednn = report.print_peaks(args, results, seen)
    breakdown = report.print_breakdown(results, table)
    fits = report.fits_summary(args, results)
    report.print_fits(args, fits)
    rec = report.recompute_summary(args, results, table)
    report.print_recompute(args, rec)
    report.print_autofit(args, found, fits)
    met = report.goals(fits, rec)
    print("\ngoals: " + ", ".join(f"{k}: {v}" for k, v in met.items()))
    return table, allocators, onednn, breakdown, fits, rec, met


def summary_of(args, found, tables):
    """The JSON summary line: the headline numbers of every table."""
    table, allocators, onednn, _, fits, rec, met = tables
    per_size = {
        key: {
            c: {t: m[key] / MIB for t, m in rows.items()} for c, rows in table.items()
        }
        for key in ("peak", "live")
    }
    return {
        "benchmark": "bench_fit",
        "smoke": args.smoke,
        "allocator": allocators,
        "onednn": onednn,
        "budget_gb": args.budget_gb,
        "peak_mib": per_size["peak"],
        "live_mib": per_size["live"],
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
        "opennmt": report.opennmt_status(args) if "opennmt" in args.configs else None,
        "goals": met,
    }


def write_everything(args, summary, results, found, tables):
    """--json: every result, the per-round ones included."""
    _, _, _, breakdown, _, rec, _ = tables
    everything = {
        "args": vars(args),
        "summary": summary,
        "breakdown": breakdown,
        "recompute": rec,
        "results": results,
        "autofit": found,
    }
    with open(args.json, "w") as out:
        json.dump(everything, out, indent=1, default=str)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        kind, name = args.child.split(":")
        (child_steps if kind == "steps" else child_autofit)(args, name)
        return
    started = time.perf_counter()
    harness.print_start()
    results, seen = measure(args)
    found = autofit(args, seen)
    tables = print_report(args, results, found, seen)
    wall = time.perf_counter() - started
    print(
        f"\ntotal wall time {wall:.0f}s, load average at end {harness.load_average()}"
    )
    summary = summary_of(args, found, tables)
    summary["wall_seconds"] = round(wall)
    if args.json:
        write_everything(args, summary, results, found, tables)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
