"""The train step alone on a translation-sized model: tokens/s, side by side.

Configuration (the translation setup of docs/benchmarks.md): transformer_base with
3+3 layers of 256, filter 1024, 4 heads, dropout 0.1, label smoothing 0.1, a shared vocabulary of
8000, micro-batches of 2048 tokens × 4 accumulation steps. The batches are made once
by t2t_lite's own token bucketing from a synthetic corpus whose sentence lengths
follow a lognormal distribution (median ~20 tokens, long tail up to max_length 100)
with Zipf-distributed ids, and every configuration trains on the same ones.

Each configuration runs in a fresh child process (a compute dtype, and optionally
other copies of the package: `--packages=LABEL=DIR,...` puts DIR first on PYTHONPATH,
e.g. a `git archive` of an older commit, to measure a change before/after in one
run).
Configurations take turns (harness.interleave); the report gives target tokens/s
per round and the median ratio to the first configuration. `--op_stats` prints the
TF profiler's op-type table of each configuration once (where the time goes).

`--variants=LABEL=HPARAMS;...` adds hparam overrides per configuration, e.g. the
gradient noise scale's cost:

  python scripts/bench_step.py --dtypes=float32,bfloat16 --rounds=3
  python scripts/bench_step.py --dtypes=float32 --rounds=5 \
    --variants="off=log_noise_scale=false;on=log_noise_scale=true"
  mkdir /tmp/before && git archive HEAD t2t_lite | tar -x -C /tmp/before
  python scripts/bench_step.py --packages=before=/tmp/before --dtypes=float32
"""

import argparse
import json
import os
import sys
import time

import numpy as np
from benchkit import harness

HERE = os.path.dirname(os.path.abspath(__file__))

TRANSLATION_HPARAMS = (
    "num_hidden_layers=3,hidden_size=256,filter_size=1024,num_heads=4,"
    "batch_size=2048,max_length=100,optimizer_multistep_accumulate_steps=4"
)
VOCAB = 8000


def synthetic_examples(count, seed, vocab=VOCAB, max_length=100):
    """Parallel id sequences with realistic lengths: lognormal (median ~20), targets
    ~10% longer than inputs, Zipf ids in [2, vocab), EOS (1) last."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(20), 0.6, count), 1, max_length - 1)

    def sentence(length):
        ids = np.minimum(rng.zipf(1.2, int(length)) + 1, vocab - 1)
        return np.append(ids, 1).astype(np.int64)

    for length in lengths:
        target = np.clip(length * rng.normal(1.1, 0.1), 1, max_length - 1)
        yield {"inputs": sentence(length), "targets": sentence(target)}


def translation_batches(hp, count, seed=1):
    """`count` token-bucketed micro-batches of the synthetic corpus, in memory."""
    import tensorflow as tf

    from t2t_lite.data.pipeline import make_dataset

    examples = list(synthetic_examples(40 * count, seed))
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={
            "inputs": tf.TensorSpec([None], tf.int64),
            "targets": tf.TensorSpec([None], tf.int64),
        },
    )
    dataset = make_dataset(
        dataset,
        batch_size=hp.batch_size,
        max_length=hp.max_length,
        training=True,
        seed=seed,
    )
    return [
        {k: tf.constant(v.numpy(), tf.int32) for k, v in batch.items()}
        for batch in dataset.take(count)
    ]


def child(args):
    """Builds the training parts, traces on every batch shape, then times `steps` micro-steps;
    prints one JSON line."""
    from benchkit import builds

    import t2t_lite

    overrides = TRANSLATION_HPARAMS  # (older copies do not know activation_dtype)
    if args.dtype != "float32":
        overrides += f",activation_dtype={args.dtype}"
    if args.overrides:
        overrides += "," + args.overrides
    hp = builds.hparams("transformer_base", overrides)
    parts = builds.build_seeded_parts(hp, VOCAB, train_steps=10**6, seed=1)
    batches = translation_batches(hp, args.batches)
    tokens = [builds.non_pad_tokens(b) for b in batches]
    step = 0
    for batch in batches:  # trace once, warm up
        builds.micro_step(parts.step, batch, step)
        step += 1
    began = time.perf_counter()
    done_tokens = 0
    for i in range(args.steps):
        out = builds.micro_step(parts.step, batches[i % len(batches)], step)
        done_tokens += tokens[i % len(batches)]
        step += 1
    float(out["loss_sum"][0])  # wait for the last step
    seconds = time.perf_counter() - began
    report = {
        "package": os.path.dirname(os.path.dirname(t2t_lite.__file__)),
        "tokens_per_second": done_tokens / seconds,
        "ms_per_micro_step": 1e3 * seconds / args.steps,
    }
    if args.op_stats:
        report["op_stats_ms"] = op_stats(parts, batches, step)
    if args.noise_ops:
        report["noise_ops_ms"] = noise_ops_ms(parts, batches)
    print(json.dumps(report))


def noise_ops_ms(parts, batches, repeats=20):
    """ms per micro-step of the ops the gradient noise scale adds (the micro-batch
    gradient's squared norm, on the real gradients of each batch), timed in the
    same process as the step: their share of a step, free of the few-percent
    drift between processes that hides it in tokens/s."""
    import tensorflow as tf

    from t2t_lite.training.step.noise_scale import NoiseScale

    total = 0.0
    for batch in batches:
        gradients, _, tokens = tf.function(parts.step._gradients)(batch)
        # Called only within this iteration, so the loop variables are the ones meant.
        norm = tf.function(lambda: NoiseScale.micro_batch(gradients, tokens)[0])  # noqa: B023
        float(norm())  # trace
        began = time.perf_counter()
        for _ in range(repeats):
            value = norm()
        float(value)
        total += (time.perf_counter() - began) / repeats
    return 1e3 * total / len(batches)


def op_stats(parts, batches, step, top=14):
    """{op type: self ms per micro-step} over one pass of `batches` (TF profiler)."""
    from benchkit import profiler

    totals, _ = profiler.step_op_stats(parts.step, batches, step, warm_up=False)
    if totals is None:
        return {}
    return {name: round(1e3 * s, 2) for name, s in totals.most_common(top)}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument(
        "--packages", default="", help="LABEL=DIR,...: package copies to compare"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=24, help="distinct micro-batches")
    p.add_argument("--steps", type=int, default=48, help="timed micro-steps")
    p.add_argument("--op_stats", action="store_true")
    p.add_argument(
        "--noise_ops",
        action="store_true",
        help="also time the noise scale's own ops, as a share of the micro-step",
    )
    p.add_argument(
        "--variants",
        default="",
        help="LABEL=HPARAMS;...: hparam overrides, one configuration each",
    )
    harness.add_json_flag(p)
    p.add_argument("--overrides", default="", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    if args.child:
        return child(args)
    harness.print_start()
    packages = [item.split("=", 1) for item in args.packages.split(",") if item]
    packages.append(("current", ""))
    variants = [item.split("=", 1) for item in args.variants.split(";") if item]
    configs = [
        (f"{label} {variant}".strip(), path, d, overrides)
        for label, path in packages
        for d in args.dtypes.split(",")
        for variant, overrides in variants or [("", "")]
    ]
    results = {config: [] for config in configs}

    def run_one(config, round_index):
        _, path, dtype, overrides = config
        flags = [f"--dtype={dtype}", f"--batches={args.batches}"]
        flags += [f"--overrides={overrides}"]
        flags += [f"--steps={args.steps}"]
        if args.op_stats and round_index == 0:
            flags.append("--op_stats")
        if args.noise_ops:
            flags.append("--noise_ops")
        # DIR first, then this folder (benchkit), then the parent's own path (the
        # "current" package is the one this process would import).
        inherited = os.environ.get("PYTHONPATH", "")
        env = {"PYTHONPATH": os.pathsep.join(p for p in (path, HERE, inherited) if p)}
        out, _ = harness.run_python([__file__, "--child", *flags], env=env)
        results[config].append(harness.last_json(out))

    harness.interleave(configs, args.rounds, run_one, label="bench_step")
    report(configs, results, args.json)


def report(configs, results, json_path=""):
    """The harness's table of tokens/s (ratio to the first config), then each
    config's op table and noise-scale share when they were asked for; the rows (and
    the summary) to `json_path` too, if given."""
    labels = {config: f"{config[0]} {config[2]}" for config in configs}
    measured = {
        labels[c]: [r["tokens_per_second"] for r in results[c]] for c in configs
    }
    baseline = labels[configs[0]]
    rows = harness.summary_rows(measured, baseline)
    title = "Train step throughput, non-pad target tokens per second"
    harness.print_table(title, rows, "tokens/s", baseline)
    summary = {
        row["config"]: {
            "tokens_per_second": row["rounds"],
            "median_ratio": row["ratio"],
        }
        for row in rows
    }
    for config in configs:
        label, first = labels[config], results[config][0]
        if first.get("op_stats_ms"):
            ops = ", ".join(f"{k} {v}" for k, v in first["op_stats_ms"].items())
            print(f"{label}: op self ms/micro-step: {ops}")
        if "noise_ops_ms" in first:
            shares = [
                r["noise_ops_ms"] / r["ms_per_micro_step"] for r in results[config]
            ]
            share = sorted(shares)[len(shares) // 2]
            print(
                f"{label}: noise-scale ops per micro-step: "
                + " ".join(f"{r['noise_ops_ms']:.1f} ms" for r in results[config])
                + f" = {100 * share:.2f}% of the micro-step (median)"
            )
            summary[label]["noise_ops_share"] = share
    harness.write_json(
        json_path, "bench_step", rows, "tokens/s", baseline, summary=summary
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
