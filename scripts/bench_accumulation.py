"""Benchmark: what exact gradient accumulation costs per micro-step.

Measures, side by side in one process and on the same data, the training throughput
(micro-steps/s and non-pad target tokens/s) of:

  t2t_n1           t2t_lite TrainStep without accumulation (n=1): the baseline.
  t2t_n8           t2t_lite TrainStep accumulating n micro-batches per update
                   (n = --accumulate_steps, 8 by default): the accumulation overhead.
  keras_n8         Keras 3's built-in accumulation for comparison: the same Transformer
                   and token loss, keras.optimizers.Adam(gradient_accumulation_steps=n)
                   and a plain tf.function GradientTape step on the per-micro-batch
                   mean loss (how Keras users do it; not token-exact, see docs/design.md §2).
  keras_n1         (extra, not in the default set) the same plain Keras step without
                   accumulation: separates "TrainStep vs a plain step" from "cost of
                   accumulating".
  t2t_n1_unshared  t2t_lite n=1 with shared_embedding_and_softmax_weights=False.
  t2t_n8_unshared  t2t_lite n=n, unshared: the embedding gradients are IndexedSlices
                   and are scatter_add-ed into the accumulators (sparse path); with
                   shared weights the softmax matmul makes that gradient dense.

Data: a fixed list of --num_batches token-bucketed micro-batches (--batch_size tokens,
padding included) drawn once from the built-in algorithmic_reverse problem through
t2t_lite.data.pipeline.make_dataset, converted to tensors up front, so the input
pipeline is NOT measured. Every config consumes the same batches in the same order.
--num_symbols enlarges the problem's vocabulary (vocab = num_symbols + 2) to see the
sparse vs dense embedding-gradient difference at a realistic vocab size.

Method: every config is built (same seed, same initial weights; t2t_lite configs
through the trainer's own build_training, see scripts/builds.py) and warmed up by one
pass over the batch list, which traces every tf.function (both the accumulate and the
accumulate-and-update functions of TrainStep) and lets oneDNN build its kernels for
every batch shape; the list length is a whole number of windows, so each batch always
goes to the same function. After one more untimed window per config, --repeats
repetitions of --steps micro-steps (default: one pass over the list) are timed,
interleaved across configs one accumulation window at a time, so that other load on
the machine hits all configs alike. No per-step sync: one per window (on CPU a
tf.function call returns when it is done anyway). Rates are medians over repetitions;
ratios are medians of per-repetition ratios to the baseline; per-call times (median
over all timed calls) are split into accumulate-only and update micro-steps. The
report is the harness's table (benchkit/harness.py); --json writes its rows.

Run (from the repository root):

  python scripts/bench_accumulation.py                      # ~2 min on 2 idle cores
  python scripts/bench_accumulation.py --num_symbols=8190    # 8k vocab: sparse vs dense
  python scripts/bench_accumulation.py --hparams_set=transformer_base \\
      --num_batches=8 --repeats=3 --configs=t2t_n1,t2t_n8,keras_n8   # ~6 min
"""

import argparse
import os
import statistics
import sys
import time

import keras
import tensorflow as tf
from benchkit import builds, harness

import t2t_lite
from t2t_lite.data.problems import AlgorithmicReverse
from t2t_lite.models.losses import token_loss
from t2t_lite.optim.batch_plan import plan_from_hparams
from t2t_lite.optim.schedule import schedule_from_hparams

ALL_CONFIGS = (
    "t2t_n1",
    "t2t_n8",
    "keras_n8",
    "keras_n1",
    "t2t_n1_unshared",
    "t2t_n8_unshared",
)
DEFAULT_CONFIGS = "t2t_n1,t2t_n8,keras_n8,t2t_n1_unshared,t2t_n8_unshared"
BASELINE = "t2t_n1"

# --- arguments -----------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--hparams_set", default="transformer_tiny", help="Dropout as in the set.")
    add("--hparams", default="", help='Extra overrides, e.g. "label_smoothing=0.0".')
    add("--batch_size", type=int, default=2048, help="Tokens per micro-batch, padded.")
    add("--accumulate_steps", type=int, default=8, help="n of the *_n8 configs.")
    add(
        "--steps",
        type=int,
        default=0,
        help="Timed micro-steps per repetition, rounded up to whole windows; "
        "0: one pass over the fixed batch list.",
    )
    add("--repeats", type=int, default=7, help="Timed repetitions per config.")
    add(
        "--warmup_steps",
        type=int,
        default=0,
        help="Untimed micro-steps per config right after building it, rounded "
        "up to whole windows; 0: one pass over the batch list.",
    )
    add(
        "--num_batches",
        type=int,
        default=32,
        help="Distinct micro-batches in the fixed data list (cycled), rounded "
        "up to whole windows.",
    )
    add("--num_symbols", type=int, default=10, help="vocab = num_symbols + 2.")
    add(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"Comma-separated subset of {', '.join(ALL_CONFIGS)}.",
    )
    add("--seed", type=int, default=1)
    harness.add_json_flag(p)
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in ALL_CONFIGS]
    if unknown or not args.configs:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(ALL_CONFIGS)}.")
    if args.accumulate_steps < 2:
        p.error("--accumulate_steps must be >= 2 (Keras refuses smaller values).")
    if args.repeats < 1:
        p.error("--repeats must be >= 1: the medians need at least one timed pass.")
    return args


def build_hparams(args):
    return builds.hparams(
        args.hparams_set,
        args.hparams,
        batch_size=args.batch_size,
        optimizer_multistep_accumulate_steps=1,
    )


# --- data ----------------------------------------------------------------------------


def fixed_batches(hp, args):
    """(list of {"inputs", "targets"} int32 tensors, list of non-pad target counts,
    vocab size)."""
    problem = AlgorithmicReverse(num_symbols=args.num_symbols, seed=args.seed)
    batches, tokens = builds.fixed_batches(problem, hp, args.num_batches, args.seed)
    return batches, tokens, problem.vocab_size


def describe_batches(batches, tokens):
    rows = [int(b["targets"].shape[0]) for b in batches]
    padded = [
        int(b["targets"].shape[0] * max(b["inputs"].shape[1], b["targets"].shape[1]))
        for b in batches
    ]
    return (
        f"{len(batches)} micro-batches: {min(rows)}-{max(rows)} sequences, "
        f"mean {statistics.mean(tokens):.0f} non-pad target tokens "
        f"(mean padded footprint {statistics.mean(padded):.0f} tokens)"
    )


# --- configs -------------------------------------------------------------------------


def t2t_config(hp, vocab_size, n, seed, train_steps):
    """The trainer's own TrainStep (build_training), accumulating n micro-batches,
    driven as the loop drives it."""
    hp = hp.override(optimizer_multistep_accumulate_steps=n)
    step = builds.build_seeded_parts(hp, vocab_size, train_steps, seed).step
    return lambda batch, i: builds.micro_step(step, batch, i)


def keras_config(hp, vocab_size, n, seed, train_steps):
    """A plain Keras-style step: mean loss per micro-batch, Adam(gradient_accumulation_steps)."""
    model = builds.build_seeded_model(hp, vocab_size, seed)
    optimizer = keras.optimizers.Adam(
        learning_rate=schedule_from_hparams(hp, train_steps, plan_from_hparams(hp)),
        beta_1=hp.optimizer_adam_beta1,
        beta_2=hp.optimizer_adam_beta2,
        epsilon=hp.optimizer_adam_epsilon,
        gradient_accumulation_steps=n if n > 1 else None,
    )
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function(input_signature=builds.batch_signature())
    def train_step(batch):
        with tf.GradientTape() as tape:
            logits = model(batch, training=True)
            loss_sum, tokens = token_loss(logits, batch["targets"], hp.label_smoothing)
            loss = loss_sum / tf.maximum(tokens, 1.0)
        optimizer.apply(tape.gradient(loss, variables), variables)
        return {"loss_sum": loss_sum, "tokens": tokens}

    return lambda batch, micro_step: train_step(batch)


def build_config(name, hp, vocab_size, args, train_steps):
    """(step_fn(batch, micro_step) -> outputs, n) for a config name."""
    n = 1 if "_n1" in name else args.accumulate_steps
    if name.startswith("keras"):
        return keras_config(hp, vocab_size, n, args.seed, train_steps), n
    shared = not name.endswith("_unshared")
    hp = hp.override(shared_embedding_and_softmax_weights=shared)
    return t2t_config(hp, vocab_size, n, args.seed, train_steps), n


# --- timing --------------------------------------------------------------------------


class Runner:
    """Feeds one config its micro-steps; sums wall/CPU time and tokens per repetition."""

    def __init__(self, name, step_fn, n):
        self.name, self.step_fn, self.n = name, step_fn, n
        self.micro_step = 0
        self.rates = []  # micro-steps/s per repetition
        self.token_rates = []  # target tokens/s per repetition
        self.cpu_ms = []  # process CPU ms (all threads) per micro-step
        self.accumulate_ms = []  # per-call times of accumulate-only micro-steps
        self.update_ms = []  # per-call times of update micro-steps
        self._rep = [0, 0.0, 0.0, 0]  # micro-steps, wall s, CPU s, tokens

    def run(self, batches, tokens, count, record):
        """Runs `count` micro-steps; adds them to the current repetition if record."""
        start, cpu_start = time.perf_counter(), time.process_time()
        out, total_tokens = None, 0
        for _ in range(count):
            i = self.micro_step
            t0 = time.perf_counter()
            out = self.step_fn(batches[i % len(batches)], i)
            if record:
                is_update = (i + 1) % self.n == 0
                (self.update_ms if is_update else self.accumulate_ms).append(
                    1e3 * (time.perf_counter() - t0)
                )
            total_tokens += tokens[i % len(batches)]
            self.micro_step += 1
        # The only sync (on CPU a call returns when done). nest: TrainStep may return
        # one tensor per replica.
        float(tf.nest.flatten(out)[0])
        if record:
            for k, v in enumerate(
                (
                    count,
                    time.perf_counter() - start,
                    time.process_time() - cpu_start,
                    total_tokens,
                )
            ):
                self._rep[k] += v

    def end_repetition(self):
        steps, wall, cpu, tokens = self._rep
        self.rates.append(steps / wall)
        self.token_rates.append(tokens / wall)
        self.cpu_ms.append(1e3 * cpu / steps)
        self._rep = [0, 0.0, 0.0, 0]


def _whole_windows(steps, window):
    return max(1, -(-steps // window)) * window


def build_runners(args, hp, batches, tokens, vocab_size, plan):
    """Builds every config and warms it up right away (tracing, oneDNN kernels for
    every batch shape, both TrainStep functions)."""
    runners = []
    for name in args.configs:
        t0 = time.perf_counter()
        step_fn, n = build_config(name, hp, vocab_size, args, plan["train_steps"])
        runner = Runner(name, step_fn, n)
        runner.run(batches, tokens, plan["warmup"], record=False)
        print(
            f"built + warmed up {name} ({plan['warmup']} micro-steps) in "
            f"{time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        runners.append(runner)
    return runners


def run_benchmark(args):
    hp = build_hparams(args)
    window = args.accumulate_steps
    args.num_batches = _whole_windows(args.num_batches, window)
    batches, tokens, vocab_size = fixed_batches(hp, args)
    steps = _whole_windows(args.steps or len(batches), window)
    warmup = _whole_windows(args.warmup_steps or len(batches), window)
    plan = {"warmup": warmup, "train_steps": warmup + window + steps * args.repeats}
    print(
        f"data: algorithmic_reverse, vocab {vocab_size}, "
        f"{describe_batches(batches, tokens)}"
    )
    runners = build_runners(args, hp, batches, tokens, vocab_size, plan)
    # The first call of a function after other models were built is slow again (~1 s
    # here), so one untimed, interleaved window runs before the timed repetitions.
    for runner in runners:
        runner.run(batches, tokens, window, record=False)
    for rep in range(args.repeats):
        timed_repetition(runners, batches, tokens, steps, window)
        print(f"repetition {rep + 1}/{args.repeats} done", flush=True)
    return runners, steps


def timed_repetition(runners, batches, tokens, steps, window):
    """Every config runs `steps` micro-steps, interleaved one window at a time, so all
    configs see the same machine load to within about a second (this machine is
    shared); the order rotates so no config always follows the same one."""
    harness.interleave(
        runners,
        steps // window,
        lambda runner, _: runner.run(batches, tokens, window, record=True),
    )
    for runner in runners:
        runner.end_repetition()


# --- report --------------------------------------------------------------------------


def _median_or_none(values):
    return statistics.median(values) if values else None


def report(runners, args, steps):
    """The harness's table of micro-steps/s (ratio to the baseline's in the same
    repetition), with tokens/s and the per-call times as columns; then the legend."""
    base = next((r for r in runners if r.name == BASELINE), runners[0])
    rows = harness.summary_rows({r.name: r.rates for r in runners}, base.name)
    for row, r in zip(rows, runners):
        row["n"] = r.n
        row["tokens/s"] = statistics.median(r.token_rates)
        row["ms/micro"] = 1e3 / row["median"]
        row["ms accum"] = _median_or_none(r.accumulate_ms)
        row["ms update"] = _median_or_none(r.update_ms)
        row["cpu ms/micro"] = statistics.median(r.cpu_ms)
    title = (
        f"Accumulation cost: hparams_set={args.hparams_set} batch_size="
        f"{args.batch_size} tokens, n={args.accumulate_steps}, {steps} timed "
        f"micro-steps x {args.repeats} repetitions"
    )
    note = (
        f"{args.repeats} repetition(s), interleaved one window at a time; spread: "
        "(max - min) / median over repetitions; ratio: median of the per-repetition "
        "ratios of micro-steps/s (= ratio of tokens/s: same batches)"
    )
    columns = ("n", "tokens/s", "ms/micro", "ms accum", "ms update", "cpu ms/micro")
    harness.print_table(title, rows, "micro-steps/s", base.name, columns, note=note)
    print(
        "\nms accum / ms update: median wall time of one call on accumulate-only "
        "micro-steps / on update micro-steps (n=1: every micro-step is an update).\n"
        "cpu ms/micro: process CPU time (all threads) per micro-step; less sensitive "
        "than wall time to other processes on the machine."
    )
    return rows, base.name


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    print(f"t2t_lite imported from {os.path.dirname(t2t_lite.__file__)}")
    harness.print_start()
    runners, steps = run_benchmark(args)
    rows, baseline = report(runners, args, steps)
    harness.write_json(
        args.json,
        "bench_accumulation",
        rows,
        "micro-steps/s",
        baseline,
        args=vars(args),
    )
    print(
        f"\ntotal wall time {time.perf_counter() - t0:.0f}s, "
        f"load average at end: {harness.load_average()}"
    )


if __name__ == "__main__":
    main()
