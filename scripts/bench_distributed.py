"""Benchmark: data parallelism on logical CPU devices (MirroredStrategy), side by side.

Logical devices must be configured before TensorFlow starts, so every measurement runs
in a fresh child process (this script with --child=...); the parent only starts the
children and prints. Three parts (--parts):

1. throughput   2 logical CPU devices x n=2 (MirroredStrategy from
                t2t_lite.training.cluster.distribution.make_strategy(2)) vs 1 device x n=4
                (the default strategy): the same tokens per update (batch_size x 4
                micro-batches) and the SAME micro-batches in the same windows: the
                first --distinct_batches token-bucketed micro-batches of --problem,
                cached and cycled, micro-batch i going to replica i mod R, so update u
                consumes micro-batches 4u..4u+3 in both. Each child builds the run
                with build_training, feeds it through ReplicaInputs (the trainer's input
                path), warms up one pass over the batches (tracing, oneDNN kernels,
                cache fill), then times --updates updates. The two configurations
                alternate in fresh processes for --rounds rounds (rotating which goes
                first); printed: per-round target tokens/s (non-pad) and process CPU
                seconds per 1k tokens, and the median over rounds of the ratio
                mirrored / single. --json writes this part's rows.
2. input        On 2 logical CPUs, in one child: ReplicaInputs (one checkpointable
                tf.data iterator per replica, batches handed over with
                experimental_distribute_values_from_function; what the trainer uses
                because TF 2.21's distributed iterators are not trackable) vs
                strategy.distribute_datasets_from_function + its iterator. a) seconds
                to produce --input_batches distributed batches, no model, from the live
                pipeline (ReplicaInputs: each replica its own shard and seed, as the
                trainer does; distribute_datasets_from_function: one pipeline whose
                batches go to the replicas in turn) and from cached batches (the
                mechanism alone); b) full train steps (n=2) fed by each. Interleaved
                rounds; medians and the median per-round ratio.
3. collectives  The all-reduce groups traced into TrainStep.accumulate and
                TrainStep.accumulate_and_update under MirroredStrategy (2 logical CPUs,
                n=--collectives_n), counted by a tf.distribute.ReductionToOneDevice
                subclass (MirroredStrategy hands every batch all-reduce to its
                cross_device_ops); printed per accumulate micro-step and per update.
                Blind spot: MirroredStrategy reduces a single value bound for a CPU
                with a fresh ReductionToOneDevice of its own, which no counter sees;
                TrainStep's all-reduce is one batch reduction of a list, so it is
                counted.

Run (from the repository root):

  python scripts/bench_distributed.py                          # ~6 min on 2 cores
  python scripts/bench_distributed.py --parts=collectives      # ~20 s
  python scripts/bench_distributed.py --parts=throughput --rounds=5 --updates=96

On a 2-core CPU, two logical devices share the same two cores: the throughput ratio
measures the overhead (or gain) of running two replicas' ops concurrently on them,
not a speed-up from more hardware.
"""

import argparse
import json
import statistics
import sys
import time

from benchkit import builds, harness
from benchkit.collectives import CountingReduction, traced_collectives

from t2t_lite.registry import PROBLEMS
from t2t_lite.training.cluster.distribution import make_strategy
from t2t_lite.training.opening.inputs import ReplicaInputs

PARTS = ("throughput", "input", "collectives")
CONFIGS = {"single": (1, 4), "mirrored": (2, 2)}  # name: (worker_gpu, n)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--parts", default=",".join(PARTS), help="Comma-separated.")
    p.add_argument("--problem", default="algorithmic_reverse")
    p.add_argument("--hparams_set", default="transformer_tiny")
    p.add_argument("--hparams", default="", help='Extra overrides, "a=1,b=2".')
    p.add_argument(
        "--batch_size", type=int, default=512, help="Tokens per micro-batch."
    )
    p.add_argument("--rounds", type=int, default=4, help="Part 1 rounds (>= 3).")
    p.add_argument("--updates", type=int, default=64, help="Part 1 timed updates.")
    p.add_argument(
        "--distinct_batches",
        type=int,
        default=32,
        help="Part 1: distinct micro-batches, cycled (a multiple of 4).",
    )
    p.add_argument("--input_batches", type=int, default=300, help="Part 2a.")
    p.add_argument("--input_steps", type=int, default=40, help="Part 2b micro-steps.")
    p.add_argument("--input_rounds", type=int, default=5, help="Part 2 rounds.")
    p.add_argument("--collectives_n", type=int, default=4, help="Part 3's n.")
    p.add_argument("--seed", type=int, default=1)
    harness.add_json_flag(p)
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--config", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if set(args.parts) - set(PARTS):
        p.error(f"--parts: choose from {', '.join(PARTS)}.")
    if args.distinct_batches % 4:
        p.error("--distinct_batches must be a multiple of 4.")
    return args


def child_args(args, child, config=""):
    """This script's command line for a child process."""
    shared = (
        "problem",
        "hparams_set",
        "hparams",
        "batch_size",
        "updates",
        "distinct_batches",
        "input_batches",
        "input_steps",
        "input_rounds",
        "collectives_n",
        "seed",
    )
    flags = [f"--{name}={getattr(args, name)}" for name in shared]
    return [__file__, f"--child={child}", f"--config={config}", *flags]


# --- in a child: common set-up ---------------------------------------------------------


def setup(args, worker_gpu, n, cross_device_ops=None):
    """(strategy, problem, parts): the strategy first (it splits the CPU before any TF
    op), then the training parts, built by the trainer's build_training."""
    strategy = make_strategy(worker_gpu, cross_device_ops=cross_device_ops)
    problem = PROBLEMS.get(args.problem)()
    problem.load(None)
    hp = builds.hparams(
        args.hparams_set,
        args.hparams,
        batch_size=args.batch_size,
        optimizer_multistep_accumulate_steps=n,
    )
    parts = builds.build_seeded_parts(
        hp, problem.vocab_size, train_steps=1_000_000, seed=args.seed, strategy=strategy
    )
    return strategy, problem, parts


def train_steps(parts, next_batch, start, count):
    """(non-pad target tokens, wall s, process CPU s) of `count` micro-steps from
    micro-step `start`, fed by next_batch()."""
    outputs = []
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        closes = parts.step.is_update_micro_step(start + i)
        outputs.append(parts.step.train_on(next_batch(), closes)["tokens"])
    tokens = sum(float(t) for out in outputs for t in out)  # one per replica
    return tokens, time.perf_counter() - wall, time.process_time() - cpu


# --- part 1: throughput ------------------------------------------------------------------


def throughput_child(args):
    worker_gpu, n = CONFIGS[args.config]
    strategy, problem, parts = setup(args, worker_gpu, n)
    replicas = strategy.num_replicas_in_sync
    distinct = args.distinct_batches

    def same_data(replica, num_replicas):
        # The same cached stream in every configuration; micro-batch i -> replica
        # i mod R, so update u always holds micro-batches 4u..4u+3.
        stream = builds.problem_batches(problem, parts.hp, args.seed)
        return stream.take(distinct).cache().repeat().shard(num_replicas, replica)

    inputs = ReplicaInputs(strategy, same_data)
    warmup = distinct // replicas  # one pass: fills the caches, traces both functions
    train_steps(parts, inputs.next, 0, warmup)
    micro_steps = args.updates * n
    tokens, wall, cpu = train_steps(parts, inputs.next, warmup, micro_steps)
    record = {"config": args.config, "replicas": replicas, "n": n, "tokens": tokens}
    record |= {"updates": args.updates, "micro_steps": micro_steps, "seconds": wall}
    record |= {"tokens_per_s": tokens / wall, "cpu_s_per_1k_tokens": 1e3 * cpu / tokens}
    print(json.dumps(record))


def throughput(args):
    results = {name: [] for name in CONFIGS}

    def run_one(name, round_index):
        stdout, _ = harness.run_python(child_args(args, "throughput", name))
        result = harness.last_json(stdout)
        results[name].append(result)
        print(
            f"  round {round_index + 1} {name:>8}: {result['replicas']} device(s) x "
            f"n={result['n']}, {result['tokens_per_s']:8.0f} tokens/s, "
            f"{result['cpu_s_per_1k_tokens']:.3f} CPU s/1k tokens "
            f"({result['tokens']:.0f} tokens in {result['seconds']:.2f} s)",
            flush=True,
        )

    print(
        f"\n== part 1: 2 logical CPUs x n=2 vs 1 device x n=4; {args.hparams_set}, "
        f"{args.problem}, batch_size {args.batch_size}, {args.updates} timed updates "
        f"of {4 * args.batch_size} tokens (padding included) =="
    )
    harness.interleave(CONFIGS, args.rounds, run_one)
    tables = {}
    for key, unit in (
        ("tokens_per_s", "tokens/s"),
        ("cpu_s_per_1k_tokens", "CPU s/1k tokens"),
    ):
        values = {name: [r[key] for r in rs] for name, rs in results.items()}
        tables[unit] = harness.summary_rows(values, "single")
        title = f"{unit}, mirrored (2 devices x n=2) against single (1 x n=4)"
        harness.print_table(title, tables[unit], unit, "single")
    harness.write_json(
        args.json,
        "bench_distributed",
        tables["tokens/s"],
        "tokens/s",
        "single",
        cpu_rows=tables["CPU s/1k tokens"],
    )


# --- part 2: the input path --------------------------------------------------------------


def input_sources(args, strategy, problem, hp, cached):
    """{name: next_batch()} of the two input paths, live or over cached batches."""
    distinct = args.distinct_batches

    def per_replica(replica, num_replicas):  # as the trainer: own shard, own seed
        stream = builds.problem_batches(
            problem, hp, args.seed + replica, replica, num_replicas
        )
        return (
            stream.take(distinct // num_replicas).cache().repeat() if cached else stream
        )

    def per_worker(context):  # one pipeline per worker, batches go to replicas in turn
        stream = builds.problem_batches(
            problem,
            hp,
            args.seed,
            context.input_pipeline_id,
            context.num_input_pipelines,
        )
        return stream.take(distinct).cache().repeat() if cached else stream

    replica_inputs = ReplicaInputs(strategy, per_replica)
    distributed = iter(strategy.distribute_datasets_from_function(per_worker))
    return {
        "ReplicaInputs": replica_inputs.next,
        "distribute_datasets": lambda: next(distributed),
    }


def produce(next_batch, count):
    """Seconds to produce `count` distributed batches."""
    start = time.perf_counter()
    for _ in range(count):
        next_batch()
    return time.perf_counter() - start


def batch_rates(args, sources):
    """{name: [batches/s per round]} of producing batches from each source."""
    for next_batch in sources.values():
        produce(next_batch, args.distinct_batches)  # fills buffers and caches
    rates = {name: [] for name in sources}

    def run_one(name, _):
        seconds = produce(sources[name], args.input_batches)
        rates[name].append(args.input_batches / seconds)

    harness.interleave(sources, args.input_rounds, run_one)
    return rates


def input_child(args):
    strategy, problem, parts = setup(args, 2, 2)
    rows = {}
    for cached in (False, True):
        sources = input_sources(args, strategy, problem, parts.hp, cached)
        label = "cached" if cached else "live"
        rows[f"batches only, {label}"] = batch_rates(args, sources)
    sources = input_sources(args, strategy, problem, parts.hp, cached=False)
    rates, step = {name: [] for name in sources}, [0]

    def steps(name, _):
        tokens, wall, _cpu = train_steps(
            parts, sources[name], step[0], args.input_steps
        )
        step[0] += args.input_steps
        rates[name].append(tokens / wall)

    for name in sources:  # traces the step for each input type, warms up
        steps(name, None)
        rates[name].clear()
    harness.interleave(sources, args.input_rounds, steps)
    rows["train steps (n=2), live"] = rates
    print_input_report(args, rows)


def print_input_report(args, rows):
    print(
        f"\n== part 2: the input path on 2 logical CPUs; {args.input_rounds} "
        f"interleaved rounds of {args.input_batches} batches / {args.input_steps} "
        f"train steps; batch_size {args.batch_size} per replica =="
    )
    print(
        f"  {'measurement':<26} {'ReplicaInputs':>14} {'distribute_datasets':>20} "
        f"{'ratio RI/DD':>12}"
    )
    for label, rates in rows.items():
        unit = "tokens/s" if "train" in label else "batches/s"
        ri, dd = rates["ReplicaInputs"], rates["distribute_datasets"]
        print(
            f"  {label:<26} {statistics.median(ri):>10.0f} {unit[:-2]:<3} "
            f"{statistics.median(dd):>16.0f} {unit[:-2]:<3} "
            f"{harness.median_ratio(ri, dd):>11.3f}x"
        )
    print(
        "  (rates per second, medians over rounds; ratio: median per-round ratio, "
        ">1 means ReplicaInputs is faster)"
    )


# --- part 3: collectives -------------------------------------------------------------------


def collectives_child(args):
    counter = CountingReduction()
    n = args.collectives_n
    strategy, problem, parts = setup(args, 2, n, cross_device_ops=counter)
    inputs = ReplicaInputs(
        strategy,
        lambda r, num: builds.problem_batches(problem, parts.hp, args.seed + r, r, num),
    )
    counts = traced_collectives(parts.step, inputs.next(), counter)
    for micro_step in range(n):  # the traced functions run: one real window
        builds.micro_step(parts.step, inputs.next(), micro_step)
    (acc_groups, acc_tensors), (upd_groups, upd_tensors) = counts.values()
    variables = len(parts.model.trainable_variables)
    print(
        f"\n== part 3: all-reduces traced into the step, 2 logical CPUs, n={n}, "
        f"{variables} trainable variables ==\n"
        f"  accumulate micro-step (TrainStep.accumulate):             "
        f"{acc_groups} group(s), {acc_tensors} tensor(s)\n"
        f"  update micro-step (TrainStep.accumulate_and_update):      "
        f"{upd_groups} group(s), {upd_tensors} tensor(s) "
        f"(gradients + loss + tokens + stop votes = {variables + 3})\n"
        f"  all-reduce groups per accumulate micro-step / per update: "
        f"{acc_groups} / {(n - 1) * acc_groups + upd_groups} "
        f"(an update = {n - 1} accumulate + 1 update micro-steps)\n"
        f"  after {n} real micro-steps: update_step {parts.step.update_step}, "
        f"micro_step {parts.step.micro_step}"
    )


# --- main ----------------------------------------------------------------------------------


CHILDREN = {
    "throughput": throughput_child,
    "input": input_child,
    "collectives": collectives_child,
}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        CHILDREN[args.child](args)
        return
    started = time.perf_counter()
    print(f"parent: {harness.environment()}", flush=True)
    if "throughput" in args.parts:
        throughput(args)
    for part in ("input", "collectives"):
        if part in args.parts:
            stdout, _ = harness.run_python(child_args(args, part))
            print(stdout.rstrip(), flush=True)
    print(
        f"\ntotal wall time {time.perf_counter() - started:.0f}s, load average at "
        f"end {harness.load_average()}"
    )


if __name__ == "__main__":
    main()
