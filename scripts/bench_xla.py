"""Benchmark: what `t2t-trainer --xla` buys, and what it costs to compile.

Side by side, in one process, on the same micro-batches, three configurations:

  plain    no XLA, batches padded to their own longest row (the default pipeline)
  padded   no XLA, batches padded to their bucket's length (pad_to_bucket=True):
           separates the cost of the extra padding from the gain of XLA
  xla      XLA (build_training(jit_compile=True)) on the bucket-padded batches: what
           --xla trains with

Three setups (--setups):

  translation  transformer_base with num_hidden_layers=3, hidden_size=256,
               filter_size=1024, num_heads=4, batch_size=2048,
               optimizer_multistep_accumulate_steps=4, vocabulary --vocab_size
               (8000), dropout as in transformer_base. Data: synthetic sentence pairs
               with lognormal lengths (source median 22 tokens, target = source x
               lognormal(0.05, 0.15), like translation; max_length 256), Zipf-like ids,
               token-bucketed by t2t_lite.data.pipeline.make_dataset.
  translation_nodropout  the same without dropout (layer_prepostprocess, attention
               and relu dropout 0): XLA draws dropout masks with its own random-bit
               generator, which on a CPU costs more than TF's kernel, so the gain
               depends on dropout.
  quickstart   transformer_tiny_fake_gpu4 (the quick-start set: 512-token micro-batches,
               n=4, max_length 32) on the built-in algorithmic_reverse problem, through
               the trainer's own batches_from_hparams.

Method: the first --num_batches training micro-batches (a whole number of accumulation
windows, so each batch always goes to the same compiled function) are drawn once with
and without bucket padding; both lists hold the same sentences in the same order (only
the padding differs), so every configuration trains on the same target tokens. Each
configuration is built the trainer's way (build_training; same seed, same initial weights).
Compile time: the first pass over the list (tracing, XLA compiling once per bucket
shape, oneDNN kernel set-up) minus a steady pass; reported per configuration. A
second, untimed pass follows. Steady state: --rounds rounds, each one pass over the
list per configuration, interleaved in a rotating order (scripts/builds.py), so
that other load on the machine hits all alike; target tokens/s (non-pad) are medians
over rounds and ratios are medians of per-round ratios to `plain`. Break-even: the
number of updates after which XLA's extra compile time is repaid by its faster steady
updates. Only the buckets met in the list are compiled here; a long run meets every
bucket (printed: how many exist), so the full compile cost is about
(XLA compile per shape) x (buckets).

Run (from the repository root):

  python scripts/bench_xla.py                          # all setups, ~35 min, 2 cores
  python scripts/bench_xla.py --setups=quickstart      # ~4 min

Prints the harness's table per setup (target tokens/s, ratio to `plain`, with seconds
per update, first pass and compile time) and, last, one JSON line with every number;
--json writes the rows of every setup (config "SETUP CONFIG"; ratios are to the same
setup's plain) and the setups' facts.
"""

import argparse
import json
import statistics
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from benchkit import builds, harness

from t2t_lite.data.pipeline import (
    batches_from_hparams,
    bucket_boundaries,
    make_dataset,
)
from t2t_lite.optim.batch_plan import accumulate_steps
from t2t_lite.registry import PROBLEMS
from t2t_lite.training.opening.build import build_training

CONFIGS = {"plain": (False, False), "padded": (True, False), "xla": (True, True)}
TRANSLATION_OVERRIDES = (
    "num_hidden_layers=3,hidden_size=256,filter_size=1024,num_heads=4,"
    "batch_size=2048,optimizer_multistep_accumulate_steps=4"
)
SETUPS = ("translation", "translation_nodropout", "quickstart")
DEFAULT_BATCHES = {"translation": 32, "translation_nodropout": 32, "quickstart": 128}
NO_DROPOUT = "layer_prepostprocess_dropout=0.0,attention_dropout=0.0,relu_dropout=0.0"


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--setups", default=",".join(SETUPS), help="Comma-separated.")
    p.add_argument(
        "--num_batches",
        type=int,
        default=0,
        help="Micro-batches per pass (rounded up to whole windows); 0: 32 for the "
        "translation setups, 128 for quickstart.",
    )
    p.add_argument("--rounds", type=int, default=3, help="Steady-state rounds.")
    p.add_argument("--vocab_size", type=int, default=8000, help="Translation setup.")
    p.add_argument("--seed", type=int, default=1)
    harness.add_json_flag(p)
    args = p.parse_args(argv)
    args.setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in args.setups if s not in SETUPS]
    if unknown or not args.setups:
        p.error(f"--setups: unknown {unknown}; choose from {', '.join(SETUPS)}.")
    if args.rounds < 1 or args.num_batches < 0:
        p.error("--rounds must be >= 1 and --num_batches >= 0.")
    return args


# --- data ----------------------------------------------------------------------------


def synthetic_pairs(vocab_size, max_length, seed):
    """An endless dataset of translation-like pairs: lognormal lengths, Zipf-like ids
    in [2, vocab_size), ending in EOS (1). The same `seed`, the same pairs."""

    def generate():
        rng = np.random.default_rng(seed)

        def sequence(length):
            ids = (rng.zipf(1.3, length - 1) - 1) % (vocab_size - 2) + 2
            return np.append(ids, 1).astype(np.int32)

        while True:
            source = int(np.clip(rng.lognormal(np.log(22), 0.6), 2, max_length + 20))
            ratio = rng.lognormal(0.05, 0.15)
            target = int(np.clip(round(source * ratio), 2, max_length + 20))
            yield {"inputs": sequence(source), "targets": sequence(target)}

    return tf.data.Dataset.from_generator(
        generate,
        output_signature={
            "inputs": tf.TensorSpec([None], tf.int32),
            "targets": tf.TensorSpec([None], tf.int32),
        },
    )


def draw_batches(setup, hp, count, args):
    """{pad_to_bucket: [batch of tensors]}: the same first `count` training
    micro-batches, padded to their longest row (False) or to their bucket (True)."""
    lists = {}
    for pad in (False, True):
        if setup.startswith("translation"):
            dataset = make_dataset(
                synthetic_pairs(args.vocab_size, hp.max_length, args.seed),
                batch_size=hp.batch_size,
                max_length=hp.max_length,
                min_length_bucket=hp.min_length_bucket,
                length_bucket_step=hp.length_bucket_step,
                training=True,
                seed=args.seed,
                pad_to_bucket=pad,
            )
        else:
            problem = PROBLEMS.get("algorithmic_reverse")()
            problem.load(None)
            dataset = batches_from_hparams(
                problem, hp, "train", training=True, seed=args.seed, pad_to_bucket=pad
            )
        lists[pad] = [
            {k: tf.constant(v.numpy()) for k, v in batch.items()}
            for batch in dataset.take(count)
        ]
    return lists


def shapes(batches):
    return {(tuple(b["inputs"].shape), tuple(b["targets"].shape)) for b in batches}


def padded_elements(batches):
    return sum(int(tf.size(b["inputs"])) + int(tf.size(b["targets"])) for b in batches)


# --- measuring -----------------------------------------------------------------------


def build(hp, vocab_size, seed, jit_compile):
    """build_training after seeding, as builds.build_seeded_parts does (plus jit_compile)."""
    keras.utils.set_random_seed(seed)
    return build_training(
        hp, vocab_size=vocab_size, train_steps=10**6, jit_compile=jit_compile
    )


def one_pass(parts, batches, start):
    """Feeds every batch as micro-steps start, start+1, ...; returns seconds (synced
    once, at the end)."""
    began = time.perf_counter()
    out = None
    for i, batch in enumerate(batches):
        out = builds.micro_step(parts.step, batch, start + i)
    float(out["loss_sum"][0])
    return time.perf_counter() - began


def measure(setup, args):
    if setup.startswith("translation"):
        overrides = TRANSLATION_OVERRIDES
        if setup == "translation_nodropout":
            overrides += "," + NO_DROPOUT
        hp = builds.hparams("transformer_base", overrides)
        vocab_size = args.vocab_size
    else:
        hp = builds.hparams("transformer_tiny_fake_gpu4")
        vocab_size = None
    n = accumulate_steps(hp)
    count = -(-(args.num_batches or DEFAULT_BATCHES[setup]) // n) * n
    lists = draw_batches(setup, hp, count, args)
    tokens = sum(builds.non_pad_tokens(b) for b in lists[False])
    if vocab_size is None:
        problem = PROBLEMS.get("algorithmic_reverse")()
        problem.load(None)
        vocab_size = problem.vocab_size
    runs, first = {}, {}
    for name, (pad, jit) in CONFIGS.items():
        runs[name] = build(hp, vocab_size, args.seed, jit)
        first[name] = one_pass(runs[name], lists[pad], 0)
        warm = one_pass(runs[name], lists[pad], count)  # untimed: settles caches
        print(
            f"{setup}: {name} first pass {first[name]:.1f} s, second {warm:.1f} s",
            flush=True,
        )
    steady = {name: [] for name in CONFIGS}

    def run_one(name, round_index):
        pad = CONFIGS[name][0]
        start = (round_index + 2) * count
        steady[name].append(one_pass(runs[name], lists[pad], start))

    harness.interleave(CONFIGS, args.rounds, run_one, label=setup)
    return summarize(setup, hp, n, count, tokens, lists, first, steady)


def summarize(setup, hp, n, count, tokens, lists, first, steady):
    """The setup's facts and its rows (harness.summary_rows of target tokens/s, ratio
    to `plain`, with s/update, 1st pass s and compile s), then the break-even."""
    updates_per_pass = count // n
    rows = harness.summary_rows(
        {name: [tokens / t for t in times] for name, times in steady.items()}, "plain"
    )
    for row in rows:
        median = statistics.median(steady[row["config"]])
        row["s/update"] = median / updates_per_pass
        row["1st pass s"] = first[row["config"]]
        row["compile s"] = first[row["config"]] - median
    result = {
        "setup": setup,
        "batch_size": hp.batch_size,
        "accumulate_steps": n,
        "micro_batches": count,
        "target_tokens_per_pass": tokens,
        "shapes_plain": len(shapes(lists[False])),
        "shapes_bucket_padded": len(shapes(lists[True])),
        "buckets_in_all": len(bucket_boundaries(hp.max_length or hp.batch_size)) + 1,
        "padding_overhead_pct": 100.0
        * (padded_elements(lists[True]) / padded_elements(lists[False]) - 1),
        "rows": rows,
    }
    return break_even(result, {row["config"]: row for row in rows})


def break_even(result, configs):
    """Adds XLA's compile seconds per shape and, against `plain` and `padded`, the
    updates after which its faster steady updates repay its extra compile time."""
    per_shape = (configs["xla"]["compile s"] - configs["padded"]["compile s"]) / max(
        result["shapes_bucket_padded"], 1
    )
    unseen = result["buckets_in_all"] - result["shapes_bucket_padded"]
    result["xla_compile_s_per_shape"] = per_shape
    result["xla_compile_s_all_buckets_estimate"] = per_shape * result["buckets_in_all"]
    for base in ("plain", "padded"):
        saved = configs[base]["s/update"] - configs["xla"]["s/update"]
        extra = configs["xla"]["compile s"] - configs[base]["compile s"]
        seen = extra / saved if saved > 0 else None
        full = (extra + per_shape * unseen) / saved if saved > 0 else None
        result[f"break_even_updates_vs_{base}"] = seen
        result[f"break_even_updates_vs_{base}_all_buckets"] = full
    return result


def print_report(r):
    title = (
        f"{r['setup']}: target tokens/s; {r['micro_batches']} micro-batches of "
        f"{r['batch_size']} tokens, n={r['accumulate_steps']}, "
        f"{r['target_tokens_per_pass']} target tokens per pass"
    )
    columns = ("s/update", "1st pass s", "compile s")
    harness.print_table(title, r["rows"], "tokens/s", "plain", columns)
    print(
        f"batch shapes: {r['shapes_plain']} unpadded, {r['shapes_bucket_padded']} "
        f"bucket-padded (of {r['buckets_in_all']} buckets); bucket padding adds "
        f"{r['padding_overhead_pct']:.1f}% elements"
    )
    print(
        f"XLA compile: {r['xla_compile_s_per_shape']:.1f} s per bucket shape, about "
        f"{r['xla_compile_s_all_buckets_estimate']:.0f} s for all "
        f"{r['buckets_in_all']} buckets"
    )
    for base in ("plain", "padded"):
        seen = r[f"break_even_updates_vs_{base}"]
        full = r[f"break_even_updates_vs_{base}_all_buckets"]
        if seen is None:
            print(f"vs {base}: XLA is not faster in steady state: it never pays.")
        else:
            print(
                f"vs {base}: XLA pays after {seen:.0f} updates (buckets met here), "
                f"about {full:.0f} updates once every bucket is compiled"
            )


def main(argv):
    args = parse_args(argv)
    harness.print_start()
    results = [measure(setup, args) for setup in args.setups]
    for result in results:
        print_report(result)
    rows = [
        {**row, "config": f"{r['setup']} {row['config']}"}
        for r in results
        for row in r["rows"]
    ]
    setups = [{k: v for k, v in r.items() if k != "rows"} for r in results]
    harness.write_json(args.json, "bench_xla", rows, "tokens/s", "plain", setups=setups)
    print(json.dumps({"environment": harness.environment(), "results": results}))


if __name__ == "__main__":
    main(sys.argv[1:])
