"""Benchmark: t2t-datagen speed, and input pipeline throughput vs. what training eats.

One run measures, on a synthetic parallel corpus written to a temp dir (--pairs
sentence pairs, default 200k; Zipf-distributed pseudo-words, about 25 words a
sentence, a word-by-word "translation" into a second pseudo-language, so that an
8k SentencePiece vocabulary is meaningful):

  1. datagen     t2t_lite.data.datagen.generate on translate_parallel_text: seconds for
                 the input check, SentencePiece training (--vocab_size) and encoding +
                 writing + shuffling the shards; sentence pairs/s of each and overall.
  2. pipeline    the training input pipeline alone (TFRecord shards → parallel reads →
                 parse → shuffle → max_length filter → token buckets → prefetch) with
                 transformer_base's batching (batch_size 4096 tokens padding included,
                 max_length 256): batches/s, non-pad target tokens/s, padded tokens/s.
  3. training    t2t_lite's TrainStep (n=1) on the same batches, as the trainer runs it:
                 a) "fixed": batches materialized in memory first (pure step cost);
                 b) "live": pulling from the pipeline while training (the trainer's
                 real setting: both share the CPU). For each --models hparams set
                 (transformer_tiny, and transformer_base with --base_steps steps),
                 3 interleaved rounds each (rotating order); medians. Besides wall-clock rates it
                 reports this process's CPU seconds per 1k tokens (all threads), a
                 measure of the pipeline's cost that other processes on the machine
                 do not disturb much, and the share of the live run's wall time
                 spent waiting for the next batch (what the pipeline directly costs
                 training).

The verdict line compares pipeline tokens/s with each model's consumption; the
pipeline is not the bottleneck when pipeline/consumption >> 1, the live run hardly
waits for batches and live ≈ fixed (the last is only meaningful on a quiet machine).

Each part prints the harness's table (benchkit/harness.py); --json writes the training
rows (config "MODEL fixed|live", ratio to the same model's fixed) with the datagen
phases, the pipeline's rates and the verdict under their own keys.

Run (from the repository root; about 5 minutes on 2 cores):

  python scripts/bench_pipeline.py
  python scripts/bench_pipeline.py --pairs=20000 --models=transformer_tiny   # quick
"""

import argparse
import itertools
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from benchkit import builds, harness

from t2t_lite.data import datagen
from t2t_lite.data.text_problems import TranslateParallelText


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pairs", type=int, default=200_000, help="Sentence pairs.")
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--num_shards", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=4096, help="Tokens per batch.")
    p.add_argument("--max_length", type=int, default=256)
    p.add_argument("--pipeline_batches", type=int, default=400)
    p.add_argument("--models", default="transformer_tiny,transformer_base")
    p.add_argument("--tiny_steps", type=int, default=30, help="Timed steps, tiny.")
    p.add_argument("--base_steps", type=int, default=4, help="Timed steps, base.")
    p.add_argument("--work_dir", default="", help="Default: a new temp dir.")
    p.add_argument("--seed", type=int, default=1)
    harness.add_json_flag(p)
    return p.parse_args(argv)


# --- 0. a synthetic parallel corpus ------------------------------------------------


def _lexicon(rng, size, syllables):
    lengths = rng.integers(1, 5, size=size)
    picks = rng.integers(0, len(syllables), size=int(lengths.sum()))
    words, start = [], 0
    for n in lengths.tolist():
        words.append("".join(syllables[i] for i in picks[start : start + n]))
        start += n
    return words


def write_corpus(directory, pairs, seed):
    """Two line-aligned files; word i of the source language ↔ word i of the target."""
    rng = np.random.default_rng(seed)
    src_syl = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    tgt_syl = [
        c + v for c in "bdfgjklmnprstvwx" for v in ["a", "e", "i", "o", "u", "é"]
    ]
    source_words = _lexicon(rng, 30000, src_syl)
    target_words = _lexicon(rng, 30000, tgt_syl)
    lengths = np.clip(rng.lognormal(3.1, 0.5, size=pairs).astype(int), 1, 120)
    word_ids = (rng.zipf(1.2, size=int(lengths.sum())) - 1) % len(source_words)
    paths = [os.path.join(directory, name) for name in ("corpus.src", "corpus.tgt")]
    with open(paths[0], "w") as src, open(paths[1], "w", encoding="utf-8") as tgt:
        start = 0
        for n in lengths.tolist():
            ids = word_ids[start : start + n].tolist()
            start += n
            src.write(" ".join(source_words[i] for i in ids) + " .\n")
            tgt.write(" ".join(target_words[i] for i in reversed(ids)) + " .\n")
    return paths, float(lengths.mean())


# --- 1. datagen ----------------------------------------------------------------------


def bench_datagen(args, work_dir):
    paths, mean_words = write_corpus(work_dir, args.pairs, args.seed)
    data_dir = os.path.join(work_dir, "data")
    config = datagen.DatagenConfig(
        vocab_size=args.vocab_size,
        num_shards=args.num_shards,
        train_source=(paths[0],),
        train_target=(paths[1],),
        dev_holdout=1000,
        overwrite=True,
    )
    events = []
    start = time.perf_counter()
    summary = datagen.generate(
        TranslateParallelText(),
        data_dir,
        config=config,
        log=lambda m: events.append((time.perf_counter(), m)),
    )
    total = time.perf_counter() - start
    marks = {
        "vocab": _first(events, "Training SentencePiece"),
        "encode": _first(events, "Encoding and writing"),
        "shuffle": _first(events, "Shuffling"),
    }
    phases = {
        "check": marks["vocab"] - start,
        "vocab": marks["encode"] - marks["vocab"],
        "encode+write": marks["shuffle"] - marks["encode"],
        "shuffle+dev+manifest": start + total - marks["shuffle"],
    }
    return data_dir, summary, phases, total, mean_words


def _first(events, prefix):
    return next(t for t, m in events if m.startswith(prefix))


def report_datagen(args, summary, phases, total, mean_words):
    """The harness's table of datagen's phases (one run): seconds and pairs/s."""
    seconds = {name: [value] for name, value in {**phases, "total": total}.items()}
    rows = harness.summary_rows(seconds)
    for row in rows:
        row["pairs/s"] = f"{args.pairs / max(row['median'], 1e-9):,.0f}"
    title = f"datagen: {args.pairs} pairs (~{mean_words:.0f} words a sentence)"
    harness.print_table(title, rows, "s", columns=("pairs/s",), note="one run")
    train = summary["splits"]["train"]
    print(
        f"vocab {summary['vocab_size']}, train {train['examples']} examples, "
        f"targets p50/p99 {train['tokens_per_example']['targets']['p50']}/"
        f"{train['tokens_per_example']['targets']['p99']} tokens"
    )
    return rows


# --- 2. pipeline ---------------------------------------------------------------------


def build_hparams(hparams_set, args):
    return builds.hparams(
        hparams_set,
        batch_size=args.batch_size,
        max_length=args.max_length,
        optimizer="adam",
        optimizer_multistep_accumulate_steps=1,
    )


def training_dataset(problem, data_dir, args):
    """The trainer's training batches, with transformer_base's bucketing."""
    hp = build_hparams("transformer_base", args)
    return builds.problem_batches(problem, hp, args.seed, data_dir=data_dir)


def batch_tokens(batch):
    targets = batch["targets"]
    rows = int(targets.shape[0])
    width = max(int(batch["inputs"].shape[1]), int(targets.shape[1]))
    return builds.non_pad_tokens(batch), rows * width


def bench_pipeline(problem, data_dir, args):
    iterator = iter(training_dataset(problem, data_dir, args))
    for _ in range(20):  # warm up: fill the shuffle buffer and the buckets
        next(iterator)
    target_tokens = padded = 0
    start = time.perf_counter()
    for _ in range(args.pipeline_batches):
        t, p = batch_tokens(next(iterator))
        target_tokens += t
        padded += p
    seconds = time.perf_counter() - start
    (row,) = harness.summary_rows({"pipeline alone": [target_tokens / seconds]})
    row["batches/s"] = args.pipeline_batches / seconds
    row["padded tokens/s"] = padded / seconds
    row["padding fraction"] = 1.0 - target_tokens / max(padded, 1)
    title = (
        f"input pipeline: batch_size {args.batch_size}, max_length {args.max_length}"
    )
    note = f"one timed pass of {args.pipeline_batches} batches"
    columns = ("batches/s", "padded tokens/s", "padding fraction")
    harness.print_table(title, [row], "target tokens/s", columns=columns, note=note)
    return row


# --- 3. training consumption ---------------------------------------------------------


def build_step(hparams_set, vocab_size, args):
    """The trainer's own TrainStep (build_training), n=1."""
    hp = build_hparams(hparams_set, args)
    return builds.build_seeded_parts(hp, vocab_size, 100000, args.seed).step


def _total(value):
    """A step output: one tensor, or a tuple of one per local replica."""
    if isinstance(value, (tuple, list)):
        return sum(float(v) for v in value)
    return float(value)


def _timed(step, batches, first_step):
    """(target tokens/s of wall time, CPU s per 1k tokens, % of wall time waiting
    for the next batch).

    The CPU time counts every thread (train step and tf.data alike), so the live
    pipeline's extra CPU shows there even when other processes share the machine;
    the waiting time is what training lost to the input pipeline directly.
    """
    tokens = waited = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    batches = iter(batches)
    for i in itertools.count():
        before = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - before
        if batch is None:
            break
        tokens += _total(builds.micro_step(step, batch, first_step + i)["tokens"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return tokens / wall, 1000.0 * cpu / tokens, 100.0 * waited / wall


def bench_training(problem, data_dir, args, hparams_set, steps, rounds=3):
    """The harness's rows of target tokens/s, fixed and live (ratio to fixed), with
    CPU s per 1k tokens and % of the time waiting: `rounds` interleaved rounds of
    `steps` each."""
    step = build_step(hparams_set, problem.vocab_size, args)
    live = iter(training_dataset(problem, data_dir, args))
    fixed = [next(live) for _ in range(steps)]
    for i in range(3):  # trace once, let oneDNN build its kernels
        builds.micro_step(step, next(live), i)
    done, runs = [3], {"fixed": [], "live": []}

    def run_one(kind, _):
        batches = fixed if kind == "fixed" else (next(live) for _ in range(steps))
        runs[kind].append(_timed(step, batches, done[0]))
        done[0] += steps

    harness.interleave(("fixed", "live"), rounds, run_one)
    rates = {kind: [r[0] for r in runs[kind]] for kind in runs}
    rows = harness.summary_rows(rates, "fixed")
    for row in rows:
        results = runs[row["config"]]
        row["CPU s/1k tokens"] = float(np.median([r[1] for r in results]))
        row["% waiting"] = float(np.median([r[2] for r in results]))
    title = (
        f"training {hparams_set}: target tokens/s from fixed batches vs the live "
        f"pipeline (n=1, {steps} timed steps a round, vocab {problem.vocab_size})"
    )
    columns = ("CPU s/1k tokens", "% waiting")
    harness.print_table(title, rows, "target tokens/s", "fixed", columns)
    fixed, live = rows
    print(
        f"the live pipeline adds "
        f"{100.0 * (live['CPU s/1k tokens'] / fixed['CPU s/1k tokens'] - 1):+.1f}% "
        "CPU; % waiting: share of the wall time spent waiting for the next batch"
    )
    return rows


def main(argv):
    args = parse_args(argv)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="bench_pipeline_")
    os.makedirs(work_dir, exist_ok=True)
    print(f"work dir {work_dir}")
    harness.print_start()
    data_dir, summary, phases, total, mean_words = bench_datagen(args, work_dir)
    datagen_rows = report_datagen(args, summary, phases, total, mean_words)
    problem = TranslateParallelText()
    problem.load(data_dir)
    pipeline = bench_pipeline(problem, data_dir, args)
    steps = {"transformer_tiny": args.tiny_steps, "transformer_base": args.base_steps}
    rows, verdict = [], {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        fixed, live = bench_training(
            problem, data_dir, args, name, steps.get(name, args.base_steps)
        )
        rows += [{**r, "config": f"{name} {r['config']}"} for r in (fixed, live)]
        verdict[name] = {
            "pipeline_over_consumption": pipeline["median"] / fixed["median"],
            "live_over_fixed": live["ratio"],
        }
    print("\nverdict: pipeline target tokens/s ÷ training consumption (fixed batches)")
    for name, v in verdict.items():
        print(
            f"  {name:18s} {v['pipeline_over_consumption']:6.1f}x; live/fixed "
            f"{v['live_over_fixed']:.2f} (median of per-round ratios)"
        )
    print(f"load average at the end {harness.load_average()}")
    harness.write_json(
        args.json,
        "bench_pipeline",
        rows,
        "target tokens/s",
        "fixed",
        datagen=datagen_rows,
        pipeline=pipeline,
        verdict=verdict,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
