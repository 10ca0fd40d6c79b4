"""Benchmark: deleting a tf.data iterator, with and without autotuning's thread, on an
idle and on a busy machine (why: t2t_lite/tf_data.py).

Four configurations, each round in fresh processes, in interleaved rounds:

  untuned idle    the training pipeline as t2t_lite builds it (make_dataset, which
                  turns tf.data's autotuning off), nothing else running
  autotune idle   the same pipeline with autotuning back on (TF's default)
  untuned busy    as "untuned idle", with one busy-loop process per other core
  autotune busy   as "autotune idle", likewise

A child builds the pipeline over a synthetic corpus held in memory (--examples pairs
from benchkit.peers.corpus, about 25 tokens a sentence; transformer_base's batching:
4096 tokens a batch, max_length 256), then --iterators times: makes an iterator,
reads --batches batches (timed: batches/s), keeps it --alive seconds more
(autotuning's timer period grows while an iterator lives, as it does during training)
and deletes it (timed).

Two tables: the mean deletion (seconds, the median over rounds; ratio to "untuned
idle") with how many deletions stalled (took over 0.1 s) and the longest; and the
pipeline's throughput (batches/s; ratio to "autotune idle": the price of turning
autotuning off). A stall lasts at most the rest of autotuning's timer period, which
doubles as the iterator ages, up to a minute: an iterator read for a whole training
run, as the trainer's are, can stall for that long. --json writes the deletion rows
with the throughput rows under their own key.

Run (from the repository root; about 7 minutes on 2 cores):

  python scripts/bench_teardown.py
  python scripts/bench_teardown.py --rounds=1 --iterators=2 --alive=2   # quick
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchkit import harness
from benchkit.peers import corpus

CONFIGS = ["untuned idle", "autotune idle", "untuned busy", "autotune busy"]
STALL_S = 0.1  # a deletion takes milliseconds when it does not wait


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterators", type=int, default=6, help="Deletions per child.")
    p.add_argument("--batches", type=int, default=50, help="Batches read per iterator.")
    p.add_argument("--alive", type=float, default=3.0, help="Seconds kept after.")
    p.add_argument("--examples", type=int, default=20_000)
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    harness.add_json_flag(p)
    return p.parse_args(argv)


# --- the child: one configuration ------------------------------------------------------


def _corpus(examples, seed=0):
    """Unbatched {"inputs", "targets"} int32 sequences: bench_peers' synthetic pairs
    (about 25 tokens a sentence, Zipf-distributed ids)."""
    import tensorflow as tf

    pairs = corpus.synthetic_pairs(examples, 8000, 25.0, 255, seed)
    return tf.data.Dataset.from_tensor_slices(
        {
            key: tf.ragged.constant([pair[k] for pair in pairs], dtype=tf.int32)
            for k, key in enumerate(["inputs", "targets"])
        }
    )


def _pipeline(autotune, examples):
    import tensorflow as tf

    from t2t_lite.data.pipeline import make_dataset

    dataset = make_dataset(
        _corpus(examples), batch_size=4096, max_length=256, training=True, seed=1
    )
    if autotune:
        options = tf.data.Options()
        options.autotune.enabled = True
        dataset = dataset.with_options(options)
    return dataset


def child(args):
    """Measures one configuration; prints one JSON line."""
    dataset = _pipeline(args.child.startswith("autotune"), args.examples)
    deletions, rates = [], []
    for _ in range(args.iterators):
        iterator = iter(dataset)
        next(iterator)  # the first batch fills the shuffle buffer: not timed
        began = time.perf_counter()
        for _ in range(args.batches):
            next(iterator)
        rates.append(args.batches / (time.perf_counter() - began))
        time.sleep(args.alive)
        began = time.perf_counter()
        del iterator
        deletions.append(time.perf_counter() - began)
    print(json.dumps({"deletions": deletions, "rates": rates}))


# --- the parent: interleaved rounds ---------------------------------------------------


def _busy_loops():
    """One busy-loop process per core but one."""
    loop = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(loop) for _ in range((os.cpu_count() or 2) - 1)]


def _measure(args, config):
    loops = _busy_loops() if config.endswith("busy") else []
    try:
        stdout, _ = harness.run_python(
            [
                os.path.abspath(__file__),
                f"--child={config}",
                f"--iterators={args.iterators}",
                f"--batches={args.batches}",
                f"--alive={args.alive}",
                f"--examples={args.examples}",
            ]
        )
    finally:
        for process in loops:
            process.kill()
            process.wait()
    return harness.last_json(stdout)


def main(argv):
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    harness.print_start()
    mean_s = {c: [] for c in CONFIGS}
    deletions = {c: [] for c in CONFIGS}
    rates = {c: [] for c in CONFIGS}

    def run_one(config, _round):
        result = _measure(args, config)
        mean_s[config].append(statistics.mean(result["deletions"]))
        deletions[config] += result["deletions"]
        rates[config].append(statistics.median(result["rates"]))

    harness.interleave(CONFIGS, args.rounds, run_one, label="teardown")
    rows = harness.summary_rows(mean_s, baseline="untuned idle")
    for row in rows:
        seconds = deletions[row["config"]]
        row["stalled"] = f"{sum(s > STALL_S for s in seconds)}/{len(seconds)}"
        row["longest_s"] = max(seconds)
    harness.print_table(
        f"Deleting an iterator after {args.batches} batches and {args.alive:g} s "
        f"more ({args.iterators} per process and round)",
        rows,
        "s",
        baseline="untuned idle",
        columns=["stalled", "longest_s"],
    )
    rate_rows = harness.summary_rows(rates, baseline="autotune idle")
    harness.print_table(
        "Pipeline throughput (make_dataset, 4096 tokens a batch)",
        rate_rows,
        "batches/s",
        baseline="autotune idle",
    )
    harness.write_json(
        args.json, "teardown", rows, "s", "untuned idle", throughput=rate_rows
    )


if __name__ == "__main__":
    main(sys.argv[1:])
