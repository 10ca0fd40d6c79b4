"""An optimizer's update: Keras's against t2t_lite's, side by side.

FusedAdam and FusedSGD (t2t_lite/optim/fused.py) apply Keras's Adam and SGD
formulas through one TensorFlow kernel per variable (ApplyAdam, ApplyKerasMomentum);
FactoredAdafactor (t2t_lite/optim/adafactor.py) is Keras's Adafactor without a
matrix's full-size slot. This measures, for --optimizer on a model's real variables
(--hparams_set, seeded), what that changes: the CPU seconds to trace one update, the
first call (graph optimization and kernel creation included), the median seconds of
an update after that, the graph's op count, the optimizer's state in MiB, and how
far the weights drift apart after the timed updates (float rounding only: the
formula is the same).

Each configuration runs in a fresh child process, interleaved over rounds; the
harness's table gives the update's median seconds and its ratio to Keras's, the
other parts as columns. --json writes the rows.

  python scripts/bench_fused.py --rounds=3                         # Adam, transformer_base
  python scripts/bench_fused.py --optimizer=momentum --rounds=3
  python scripts/bench_fused.py --optimizer=adafactor --rounds=3
  python scripts/bench_fused.py --hparams_set=transformer_test --rounds=5
"""

import argparse
import json
import statistics
import sys
import time

from benchkit import builds, harness

CONFIGS = ("keras", "t2t_lite")
# --optimizer: (Keras's class name, t2t_lite's, keyword arguments)
OPTIMIZERS = {
    "adam": ("Adam", "FusedAdam", {"beta_1": 0.9, "beta_2": 0.997, "epsilon": 1e-9}),
    "momentum": ("SGD", "FusedSGD", {"momentum": 0.9}),
    "sgd": ("SGD", "FusedSGD", {}),
    "adafactor": (
        "Adafactor",
        "FactoredAdafactor",
        {"beta_2_decay": -0.8, "clip_threshold": 1.0},
    ),
}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hparams_set", default="transformer_base")
    p.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZERS))
    p.add_argument("--updates", type=int, default=10, help="timed updates per run")
    p.add_argument("--config", default="", help=argparse.SUPPRESS)  # child mode
    harness.add_json_flag(p)
    return p.parse_args(argv)


def child(args):
    import keras
    import numpy as np
    import tensorflow as tf

    from t2t_lite.graph import graph_function
    from t2t_lite.optim import adafactor, fused

    hp = builds.hparams(args.hparams_set)
    model = builds.build_seeded_model(hp, vocab_size=8000, seed=1)
    variables = model.trainable_variables
    keras_name, ours, options = OPTIMIZERS[args.optimizer]
    if args.config == "keras":
        optimizer_class = getattr(keras.optimizers, keras_name)
    else:
        optimizer_class = getattr(fused, ours, None) or getattr(adafactor, ours)
    optimizer = optimizer_class(learning_rate=1e-3, **options)
    optimizer.build(variables)
    state = sum(v.numpy().nbytes for v in optimizer.variables)
    rng = np.random.default_rng(0)
    gradients = [
        tf.constant(rng.standard_normal(v.shape).astype(np.float32) * 1e-3)
        for v in variables
    ]
    update = graph_function(lambda g: optimizer.apply(g, variables))
    out = {"variables": len(variables), "state_mib": state / 2**20}
    began = time.process_time()
    graph = update.get_concrete_function(gradients).graph
    out["trace_cpu"] = time.process_time() - began
    out["ops"] = len(graph.get_operations())
    began = time.perf_counter()
    update(gradients)
    out["first_call"] = time.perf_counter() - began
    times = []
    for _ in range(args.updates):
        began = time.perf_counter()
        update(gradients)
        float(tf.reduce_sum(variables[0]))  # waits for the update
        times.append(time.perf_counter() - began)
    out["update"] = statistics.median(times)
    out["weights_sum"] = float(
        sum(np.sum(v.numpy(), dtype=np.float64) for v in variables)
    )
    print(json.dumps(out))


def main(argv):
    args = parse(argv)
    if args.config:
        return child(args)
    harness.print_start()
    flags = (
        f"--hparams_set={args.hparams_set}",
        f"--optimizer={args.optimizer}",
        f"--updates={args.updates}",
    )
    results = harness.child_rounds(
        __file__, CONFIGS, args.rounds, flags, label=args.optimizer
    )
    report(args, results)


PARTS = ("trace_cpu", "first_call", "ops", "state_mib", "variables")


def report(args, results):
    """The harness's table: median seconds of an update per configuration (ratio to
    Keras's), each part's median as a column; then the per-part ratios."""
    updates = {c: [r["update"] for r in results[c]] for c in CONFIGS}
    rows = harness.summary_rows(updates, "keras")
    for row in rows:
        for key in PARTS:
            row[key] = statistics.median(r[key] for r in results[row["config"]])
    title = (
        f"{args.optimizer}'s update on {args.hparams_set}'s variables: "
        "seconds per update"
    )
    harness.print_table(title, rows, "s", "keras", PARTS)
    ratios = {
        key: harness.median_ratio(
            [r[key] for r in results["t2t_lite"]], [r[key] for r in results["keras"]]
        )
        for key in ("update", "trace_cpu", "first_call", "ops", "state_mib")
    }
    drift = max(
        abs(f["weights_sum"] - k["weights_sum"])
        for f, k in zip(results["t2t_lite"], results["keras"])
    )
    print(
        "t2t_lite / keras per part (median of per-round ratios): "
        + ", ".join(f"{key} {ratio:.3g}" for key, ratio in ratios.items())
        + f"; largest difference of the weights' sums: {drift:.3g}"
    )
    harness.write_json(args.json, "bench_fused", rows, "s", "keras", part_ratios=ratios)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
