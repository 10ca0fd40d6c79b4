"""What a fresh process pays before its first update: building the training parts
and the first call of each compiled function (its trace and graph optimization),
with t2t_lite's functions compiled as they are (without AutoGraph, t2t_lite/graph.py)
and with AutoGraph on, side by side.

Each configuration runs in a fresh process, interleaved over rounds; the child
prints one JSON line of seconds; "process" is its whole life (TensorFlow's
import included), timed by the parent. The harness's table has a row per
configuration: the median seconds of the three first calls (accumulate, update,
evaluate) and their ratio to AutoGraph's, then each part's median; a line after it
gives graph_function / autograph per part. --json writes the rows.

  python scripts/bench_startup.py --rounds=3
  python scripts/bench_startup.py --hparams_set=transformer_base --rounds=2
"""

import argparse
import json
import statistics
import sys
import time

from benchkit import builds, harness

CONFIGS = ("graph_function", "autograph")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hparams_set", default="transformer_test")
    p.add_argument("--config", default="", help=argparse.SUPPRESS)  # child mode
    harness.add_json_flag(p)
    return p.parse_args(argv)


def child(args):
    import numpy as np
    import tensorflow as tf

    from t2t_lite.training.reporting.evaluation import Evaluator

    if args.config == "autograph":
        # graph_function looks tf.function up when it is called: force AutoGraph on.
        plain = tf.function
        tf.function = lambda fn=None, **kw: plain(fn, **{**kw, "autograph": True})
    out = {}
    hp = builds.hparams(args.hparams_set, optimizer_multistep_accumulate_steps=2)
    began = time.perf_counter()
    parts = builds.build_seeded_parts(hp, vocab_size=1000, train_steps=100, seed=1)
    out["build"] = time.perf_counter() - began
    rng = np.random.default_rng(0)
    batch = {
        key: tf.constant(rng.integers(2, 1000, size=(8, 20)), tf.int32)
        for key in ("inputs", "targets")
    }
    for name, call in (
        ("accumulate", lambda: parts.step.accumulate(batch)),
        ("update", lambda: parts.step.accumulate_and_update(batch)),
        ("evaluate", lambda: Evaluator(parts.model, 0.1)._step(batch)),
    ):
        began = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), call())
        out[name] = time.perf_counter() - began
    began = time.perf_counter()
    parts.step.accumulate(batch)["loss_sum"][0].numpy()
    out["accumulate_again"] = time.perf_counter() - began
    print(json.dumps(out))


def main(argv):
    args = parse(argv)
    if args.config:
        return child(args)
    harness.print_start()
    results = harness.child_rounds(
        __file__,
        CONFIGS,
        args.rounds,
        [f"--hparams_set={args.hparams_set}"],
        label="startup",
    )
    report(args, results)


PARTS = ("build", "accumulate", "update", "evaluate", "accumulate_again", "process")


def report(args, results):
    """The harness's table: first calls' seconds per configuration (ratio to
    AutoGraph's), each part's median as a column; then the per-part ratios."""
    for runs in results.values():
        for r in runs:
            r["first_calls"] = r["accumulate"] + r["update"] + r["evaluate"]
    seconds = {c: {k: [r[k] for r in results[c]] for k in PARTS} for c in CONFIGS}
    first = {c: [r["first_calls"] for r in results[c]] for c in CONFIGS}
    rows = harness.summary_rows(first, "autograph")
    for row in rows:
        for key in PARTS:
            row[f"{key} s"] = statistics.median(seconds[row["config"]][key])
    title = (
        f"Start-up of a fresh process ({args.hparams_set}): seconds of the first "
        "calls (accumulate + update + evaluate)"
    )
    columns = tuple(f"{key} s" for key in PARTS)
    harness.print_table(title, rows, "s", "autograph", columns)
    ratios = {
        key: harness.median_ratio(
            seconds["graph_function"][key], seconds["autograph"][key]
        )
        for key in PARTS
    }
    print(
        "graph_function / autograph per part (median of per-round ratios): "
        + ", ".join(f"{key} {ratio:.2f}" for key, ratio in ratios.items())
    )
    harness.write_json(
        args.json, "bench_startup", rows, "s", "autograph", part_ratios=ratios
    )
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
