"""Benchmark: peak memory of accumulation (b tokens x n) vs one big batch (n*b tokens).

What accumulation is for: train with the batch of n GPUs in the memory of one. Each
configuration runs in a FRESH child process (this script with --child=...), so that
no configuration inherits another's high-water mark, allocator caches or traced
functions; the parent only starts the children, interleaved over --rounds rounds
(rotating which goes first), and prints:

  b_n8    micro-batches of --micro_batch_size (b) tokens, n = --accumulate_steps
          (8): n*updates micro-steps, --updates optimizer updates.
  nb_n1   batches of n*b tokens, n=1: --updates updates. The big batch n=8 emulates.
  b_n1    batches of b tokens, n=1, as many micro-steps as b_n8 (the same batches):
          the reference for what accumulation adds to a plain b-token step.

Model: --hparams_set (transformer_base: hidden 512, filter 2048, 8 heads, dropout
0.1) with --layers encoder and decoder layers (2+2 by default, for CPU time: fewer
layers shrink weights, slots and activations alike, but the logits, which grow with
vocab x tokens, do not), vocabulary --vocab_size (8000) on the built-in
algorithmic_reverse problem (--num_symbols = vocab - 2, sequence lengths
--min_length..--max_length), token-bucketed by the trainer's pipeline
(builds.fixed_batches; batch_size = b or n*b, padding included). The run is
built by the trainer's build_training (builds.build_seeded_parts), same seed everywhere.

Each child reports:

- baseline: after building the run (TF runtime, weights, Adam slots, and for b_n8 the
  accumulators) and the batches, before the first step: RSS (/proc/self/status VmRSS)
  and the TF CPU allocator's live bytes (tf.config.experimental.get_memory_info;
  TF keeps CPU statistics only in its BFC allocator or oneDNN's, and oneDNN is off
  on some CPUs, so every child runs with TF_CPU_ALLOCATOR_USE_BFC=true). The
  allocator counts the chunks its tensors
  and variables occupy (rounded up, so 71.7 MiB of accumulators count 82 MiB), not
  the runtime, Python, or graph and kernel caches.
- peak: the largest RSS (VmHWM; == getrusage ru_maxrss) and the largest TF allocator
  peak over the whole run, and peak - baseline. The RSS high-water mark is reset
  after the baseline and after every update (writing "5" to /proc/self/clear_refs),
  so each update's own RSS peak is known too; without that permission the peaks
  are cumulative (the JSON says which).
- per micro-step: the TF allocator's live bytes after it and its peak (stats reset
  before every micro-step), and RSS after it.
- per update: RSS after it and its RSS peak.

The report is the harness's table (benchkit/harness.py): peak RSS per configuration
with its ratio to nb_n1's, and the baselines and TF allocator numbers as columns;
--json writes its rows, with every child's record under "results". From those the
parent derives (medians over rounds; ratios are medians of per-round
ratios): peak(b_n8) / peak(nb_n1) on total RSS, on RSS peak - baseline, and on the
same with the accumulators charged to training (they sit in b_n8's baseline); the
same on TF allocator bytes; the accumulator's bytes vs the model's trainable bytes
and vs the growth of b_n8's baseline over b_n1's; RSS after every update and TF live
bytes after every micro-step of b_n8 (growth per micro-step would show there); and
what a b_n8 micro-step allocates at its peak, above its own baseline, beyond the
b_n1 step on the very same batch (from the second window on), for accumulate-only
and for update micro-steps, in MiB and in model-sized copies. The peaks depend on
the order in which TF's two inter-op threads run the ops, so that last comparison
is noisy per micro-step; the medians are what to read.

Run (from the repository root):

  python scripts/bench_memory.py      # 2 rounds: ~12 min on 2 idle cores (3 rounds
                                      # took 33 min at load average 9)
  python scripts/bench_memory.py --rounds=3 --layers=3 --json=/tmp/memory.json
"""

import argparse
import gc
import json
import resource
import statistics
import sys
import time

from benchkit import builds, harness
from benchkit.accumulation_memory import print_accumulation_costs
from benchkit.memory import (
    reset_peak,
    reset_rss_peak,
    status_mib,
    tf_memory,
    variable_mib,
)

from t2t_lite.data.problems import AlgorithmicReverse

CONFIGS = ("b_n8", "nb_n1", "b_n1")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hparams_set", default="transformer_base")
    p.add_argument("--hparams", default="", help='Extra overrides, "a=1,b=2".')
    p.add_argument(
        "--layers", type=int, default=2, help="Encoder and decoder layers (each)."
    )
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument(
        "--micro_batch_size", type=int, default=2048, help="b: tokens per micro-batch."
    )
    p.add_argument("--accumulate_steps", type=int, default=8, help="n of b_n8.")
    p.add_argument("--updates", type=int, default=3, help="Updates per config.")
    p.add_argument("--min_length", type=int, default=8, help="Shortest sequence.")
    p.add_argument("--max_length", type=int, default=64, help="Longest sequence.")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"Subset of {CONFIGS}.")
    harness.add_json_flag(p)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not args.configs or set(args.configs) - set(CONFIGS):
        p.error(f"--configs: choose from {', '.join(CONFIGS)}.")
    if args.accumulate_steps < 2:
        p.error("--accumulate_steps must be >= 2.")
    return args


def child_args(args, config):
    """This script's command line for the child measuring `config`."""
    shared = (
        "hparams_set",
        "hparams",
        "layers",
        "vocab_size",
        "micro_batch_size",
        "accumulate_steps",
        "updates",
        "min_length",
        "max_length",
        "seed",
    )
    flags = [f"--{name}={getattr(args, name)}" for name in shared]
    return [__file__, f"--child={config}", *flags]


def shape(args, config):
    """(tokens per batch, n, batches) of a configuration."""
    b, n = args.micro_batch_size, args.accumulate_steps
    return {
        "b_n8": (b, n, n * args.updates),
        "nb_n1": (n * b, 1, args.updates),
        "b_n1": (b, 1, n * args.updates),
    }[config]


# --- in a child: measuring -------------------------------------------------------------


def build(args, config):
    """(parts, batches): the fixed batches first, then the training parts
    (build_training)."""
    tokens, n, count = shape(args, config)
    hp = builds.hparams(
        args.hparams_set,
        args.hparams,
        num_hidden_layers=args.layers,
        batch_size=tokens,
        optimizer_multistep_accumulate_steps=n,
    )
    problem = AlgorithmicReverse(
        num_symbols=args.vocab_size - 2,
        min_length=args.min_length,
        max_length=args.max_length,
        seed=args.seed,
    )
    batches, _ = builds.fixed_batches(problem, hp, count, args.seed)
    vocab_size = problem.vocab_size
    del problem  # its generated arrays
    parts = builds.build_seeded_parts(hp, vocab_size, count, args.seed)
    gc.collect()
    return parts, batches


def child(args):
    started = time.perf_counter()
    parts, batches = build(args, args.child)
    step = parts.step
    accumulator = step.accumulator
    result = {
        "config": args.child,
        "batch_tokens": shape(args, args.child)[0],
        "n": step.n,
        "batches": [list(b["targets"].shape) for b in batches],
        "trainable_mib": variable_mib(parts.model.trainable_variables),
        "accumulator_mib": variable_mib(accumulator.variables) if accumulator else 0,
        "baseline_rss": status_mib("VmRSS"),
        "baseline_hwm": status_mib("VmHWM"),
        "baseline_ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "baseline_tf": tf_memory(),
    }
    result["rss_peak_resettable"] = reset_rss_peak()
    micro, updates = [], []
    for i, batch in enumerate(batches):
        before = tf_memory()
        reset_peak()
        builds.micro_step(step, batch, i)
        after = tf_memory()
        micro.append(
            {
                "update": step.is_update_micro_step(i),
                "rss": status_mib("VmRSS"),
                "tf_current": after and after["current"],
                "tf_peak_above_start": after and after["peak"] - before["current"],
                "tf_peak": after and after["peak"],
            }
        )
        if step.is_update_micro_step(i):
            updates.append(
                {"rss": status_mib("VmRSS"), "rss_peak": status_mib("VmHWM")}
            )
            reset_rss_peak()
    result["micro_steps"], result["updates"] = micro, updates
    result["peak_rss"] = max(
        [result["baseline_hwm"]] + [u["rss_peak"] for u in updates]
    )
    if result["baseline_tf"] is not None:
        result["peak_tf"] = max(
            [result["baseline_tf"]["peak"]] + [m["tf_peak"] for m in micro]
        )
    result["seconds"] = time.perf_counter() - started
    print(json.dumps(result))


# --- in the parent: running and reporting ----------------------------------------------

# TF keeps CPU allocator statistics in BFC (or oneDNN's allocator, not on every CPU).
ALLOCATOR_STATS = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


def measure(args):
    """{config: [child result per round]}, interleaved over rounds."""
    results = {c: [] for c in args.configs}

    def run_one(config, round_index):
        stdout, _ = harness.run_python(child_args(args, config), env=ALLOCATOR_STATS)
        result = harness.last_json(stdout)
        results[config].append(result)
        print(
            f"round {round_index + 1} {config:>6}: peak RSS {result['peak_rss']:7.0f} "
            f"MiB, baseline {result['baseline_rss']:6.0f} MiB "
            f"({result['seconds']:.0f}s)",
            flush=True,
        )

    harness.interleave(args.configs, args.rounds, run_one)
    return results


def derived(result):
    """The numbers of one child the tables use, in MiB."""
    d = {
        "baseline_rss": result["baseline_rss"],
        "peak_rss": result["peak_rss"],
        "rss_delta": result["peak_rss"] - result["baseline_rss"],
        "rss_delta_acc": result["peak_rss"]
        - result["baseline_rss"]
        + result["accumulator_mib"],
    }
    if result["baseline_tf"] is not None:
        base = result["baseline_tf"]["current"]
        d.update(
            baseline_tf=base,
            peak_tf=result["peak_tf"],
            tf_delta=result["peak_tf"] - base,
            tf_delta_acc=result["peak_tf"] - base + result["accumulator_mib"],
        )
    return d


def median_of(results, key):
    return statistics.median(derived(r)[key] for r in results)


COLUMNS = {  # the table's further columns: their derived() keys
    "baseline RSS": "baseline_rss",
    "peak - baseline": "rss_delta",
    "TF baseline": "baseline_tf",
    "TF peak": "peak_tf",
    "TF peak - baseline": "tf_delta",
}
RATIOS = {
    "peak_rss": "total peak RSS",
    "rss_delta": "RSS peak - baseline",
    "rss_delta_acc": "RSS peak - baseline + accumulators",
    "peak_tf": "TF allocator peak",
    "tf_delta": "TF peak - baseline",
    "tf_delta_acc": "TF peak - baseline + accumulators",
}


def report(args, results):
    """The harness's table of peak RSS per configuration (ratio to nb_n1's), the
    baselines and TF allocator medians as columns; then b_n8 / nb_n1 on every
    measure. Returns (rows, baseline label, those ratios)."""
    b, n = args.micro_batch_size, args.accumulate_steps
    names = {"b_n8": f"b={b} x n={n}", "nb_n1": f"{n}b={n * b} x n=1"}
    names["b_n1"] = f"b={b} x n=1"
    has_tf = all(r["baseline_tf"] is not None for rs in results.values() for r in rs)
    columns = [c for c, key in COLUMNS.items() if has_tf or "tf" not in key]
    peaks = {
        names[c]: [derived(r)["peak_rss"] for r in rs] for c, rs in results.items()
    }
    baseline = names["nb_n1"] if "nb_n1" in results else None
    rows = harness.summary_rows(peaks, baseline)
    for row, rs in zip(rows, results.values()):
        row.update({c: median_of(rs, COLUMNS[c]) for c in columns})
    title = (
        f"Peak memory, MiB: {args.hparams_set}, {args.layers}+{args.layers} layers, "
        f"vocab {args.vocab_size}, {args.updates} updates per config"
    )
    harness.print_table(title, rows, "peak RSS MiB", baseline, columns)
    if "b_n8" not in results or "nb_n1" not in results:
        return rows, baseline, {}
    ratios = {}
    for key, what in RATIOS.items():
        if "tf" in key and not has_tf:
            continue
        values = [derived(r)[key] for r in results["b_n8"]]
        base = [derived(r)[key] for r in results["nb_n1"]]
        per_round = [v / b for v, b in zip(values, base)]
        ratios[key] = harness.median_ratio(values, base)
        print(
            f"ratio b_n8 / nb_n1, {what:<36}: {ratios[key]:.3f} "
            f"(rounds: {', '.join(f'{r:.3f}' for r in per_round)})"
        )
    return rows, baseline, ratios


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        child(args)
        return
    started = time.perf_counter()
    harness.print_start()
    results = measure(args)
    rows, baseline, ratios = report(args, results)
    first = next(iter(results.values()))[0]
    print(f"model: {first['trainable_mib']:.1f} MiB of float32 trainable variables")
    summary = {
        "ratios": ratios,
        "accumulation": print_accumulation_costs(args, results),
    }
    print(f"\ntotal wall time {time.perf_counter() - started:.0f}s")
    harness.write_json(
        args.json,
        "bench_memory",
        rows,
        "peak RSS MiB",
        baseline,
        args=vars(args),
        summary=summary,
        results=results,
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
