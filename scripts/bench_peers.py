"""Benchmark: t2t_lite's training throughput against the frameworks a user would pick
instead, side by side in one run, on the same data and the same architecture.

Configurations (--configs, all by default):

  t2t_f32     t2t_lite TrainStep (build_training, the trainer's own assembly), float32.
  t2t_bf16    the same with hparam activation_dtype=bfloat16 (mixed precision).
  t2t_xla     the same, float32, with build_training(jit_compile=True) (XLA) and the
              batches padded to their length bucket (pipeline's pad_to_bucket), as
              `t2t-trainer --xla` trains; reported as unavailable when build_training has
              no jit_compile keyword.
  keras_f32   what a Keras 3 user writes: keras_hub.layers.TransformerEncoder /
              TransformerDecoder + TokenAndPositionEmbedding (tied softmax), model.fit
              with keras.optimizers.Adam(gradient_accumulation_steps=n), float32.
  keras_bf16  the same under keras.mixed_precision policy "mixed_bfloat16".
  opennmt_f32 OpenNMT-tf 2.32 (TensorFlow 2.12, in its own virtual environment, see
              --setup_opennmt) driven through its own `onmt-main train`, with a model
              file defining opennmt.models.Transformer of the same sizes.

The same for all: encoder and decoder layers of --hidden_size (--num_layers each),
--filter_size, --num_heads, dropout --dropout everywhere, label smoothing, one shared
vocabulary of --vocab_size ids (shared embeddings and softmax), micro-batches of
--batch_size tokens (padding included, token-bucketed) and --accumulate_steps
micro-batches per optimizer update (default 2048 x 4 = 8192 tokens per update).

The same data for all: a synthetic parallel corpus of --corpus_sentences pairs
(lognormal sentence lengths, mean --mean_length, clipped to 1..--max_length, target
length correlated with the source, Zipf-distributed token ids). t2t_lite's own token
bucketing (data/pipeline.py via benchkit.builds.fixed_batches) turns its shuffled stream into
--updates x n micro-batches; t2t_lite and Keras train on exactly these batches, and
OpenNMT-tf reads the whole corpus from text files ("w17 w5 ...", a plain vocabulary
file) and batches it its own way (batch_type tokens, length_bucket_width 1,
effective_batch_size = tokens per update). The corpus is large on purpose: OpenNMT
flushes its half-filled length buckets at every epoch end, which on a corpus of only
the sentences of those few micro-batches would make every OpenNMT batch half empty.

What differs, besides the frameworks (by design: each does what its users get):
  - Keras: learned position embeddings (keras-hub), no sqrt(hidden) embedding scale,
    biases in attention projections, Keras's loss reduction (a mean over all positions
    of each micro-batch, padding weighted 0; updates average the n micro-batch means,
    not token-exact, docs/design.md §2), label smoothing over all ids, decoder input starts
    with id 1. jit_compile="auto" (Keras's default) means no XLA on a CPU-only machine.
  - OpenNMT-tf: its own input pipeline (reads and tokenizes text in tf.data threads,
    running beside the training step), its own buckets; vocabulary + <blank>, <s>,
    </s>, <unk>; biases in attention projections; Adam (not LazyAdam), Noam schedule;
    float32 only (its --mixed_precision is float16 and refuses to run without an
    NVIDIA GPU).
  - t2t_lite and Keras get in-memory batches: their input pipelines are not measured.

Method: t2t_lite and Keras configs each live in a worker process of their own (no
state leaks between them, e.g. Keras's global mixed-precision policy), started
together from a forkserver that has imported TensorFlow once; each builds its
model and warms up with one untimed update (tracing; t2t_xla: one untimed pass over
all the batches, as XLA compiles once per batch shape; the compile times show as
"warmup s"). Then --rounds rounds,
in which every configuration in turn (benchkit.harness.interleave: rotating order) trains
--updates updates on the same batches: tokens/s = non-pad target tokens (EOS
included) / wall time. OpenNMT-tf runs once per round in its venv's python: a fresh
`onmt-main train` of --opennmt_warmup + --updates updates, logging every update; its
tokens/s is the "target" tokens/s it logs, weighted by the log timestamps, over the
updates after the warmup ones. Reported: medians over rounds, ratios (median of
per-round ratios) of every t2t_lite config to every peer, and model FLOPs utilization
(`training_flops`) against this machine's tf.matmul peak (2048x2048, --peak_size;
float32 and bfloat16, best of several, measured before and after the rounds): float32
configs against the float32 peak, bfloat16 ones against the bfloat16 peak.

Run (from the repository root):

  python scripts/bench_peers.py --setup_opennmt   # once: OpenNMT-tf venv (network)
  python scripts/bench_peers.py                   # ~14 min on 2 quiet cores
  python scripts/bench_peers.py --smoke           # tiny model, every config, ~1 min

On a loaded machine everything takes longer (the XLA warmup most: it compiles every
batch shape) and the spread grows; the load average is printed at start and end.

The table is the harness's (benchkit/harness.py): medians, spread and the ratio to
t2t_f32. The last line printed is a JSON summary (tests/test_bench_peers.py reads
it); --json writes the table's rows.
"""

import argparse
import json
import os
import sys
import tempfile
import time

from benchkit import builds, flops, harness
from benchkit.peers import corpus, opennmt, workers
from benchkit.peers.results import (
    ALL_CONFIGS,
    DTYPES,
    TABLE_COLUMNS,
    Result,
    ratios,
    table_rows,
)

SMOKE = {  # --smoke: a tiny model, one round of one update (two micro-batches)
    "hidden_size": 32,
    "filter_size": 64,
    "num_layers": 1,
    "num_heads": 2,
    "vocab_size": 200,
    "batch_size": 256,
    "accumulate_steps": 2,
    "updates": 1,
    "rounds": 1,
    "mean_length": 8,
    "max_length": 16,
    "corpus_sentences": 500,
    "peak_size": 512,  # the MFU's peak only has to exist
}

# --- arguments -----------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--smoke", action="store_true", help="Tiny model, 1 round: seconds.")
    add("--setup_opennmt", action="store_true", help="Create the OpenNMT venv, exit.")
    add("--venv", default=opennmt.DEFAULT_VENV, help="OpenNMT-tf virtual environment.")
    add("--configs", default=",".join(ALL_CONFIGS), help="Comma-separated subset.")
    add("--rounds", type=int, default=3, help="Interleaved rounds (medians).")
    add("--updates", type=int, default=5, help="Timed updates per config per round.")
    add("--opennmt_warmup", type=int, default=2, help="Untimed OpenNMT updates (>=2).")
    add("--accumulate_steps", type=int, default=4, help="Micro-batches per update.")
    add("--batch_size", type=int, default=2048, help="Tokens per micro-batch.")
    add("--hidden_size", type=int, default=256)
    add("--filter_size", type=int, default=1024)
    add("--num_layers", type=int, default=3, help="Encoder and decoder layers each.")
    add("--num_heads", type=int, default=4)
    add("--vocab_size", type=int, default=8000, help="Shared vocabulary (ids).")
    add("--dropout", type=float, default=0.1)
    add("--label_smoothing", type=float, default=0.1)
    add("--mean_length", type=float, default=25.0, help="Mean sentence length.")
    add("--max_length", type=int, default=100, help="Longest sentence (tokens).")
    add("--corpus_sentences", type=int, default=50000, help="Synthetic corpus size.")
    add("--seed", type=int, default=1)
    add("--peak_size", type=int, default=2048, help="Side of the peak's tf.matmul.")
    add("--work_dir", default="", help="Data, configs and logs; default: a temp dir.")
    harness.add_json_flag(p)
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in ALL_CONFIGS]
    if unknown or not args.configs:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(ALL_CONFIGS)}.")
    if args.accumulate_steps < 2 or args.opennmt_warmup < 2 or args.updates < 1:
        p.error(
            "need --accumulate_steps >= 2 (Keras refuses less), "
            "--opennmt_warmup >= 2 (OpenNMT ignores 2), --updates >= 1."
        )
    return args


def model_spec(args, work_dir):
    """What every worker needs to build its configuration, as a JSON-able dict."""
    keys = (
        "corpus_sentences",
        "hidden_size",
        "filter_size",
        "num_layers",
        "num_heads",
        "vocab_size",
        "dropout",
        "label_smoothing",
        "batch_size",
        "accumulate_steps",
        "seed",
    )
    spec = {k: getattr(args, k) for k in keys}
    spec["max_tokens"] = args.max_length + 1  # a sentence + EOS
    spec["batches_path"] = os.path.join(work_dir, "batches.npz")
    spec["xla_batches_path"] = os.path.join(work_dir, "batches_xla.npz")
    return spec


# --- data ---------------------------------------------------------------------------


def make_batches(args, spec, pairs):
    """The --updates x n micro-batches t2t_lite and Keras train on, from the shuffled
    stream of `pairs` (saved for the workers)."""
    count = args.updates * args.accumulate_steps
    hp = builds.hparams(
        "transformer_base",
        "",
        batch_size=args.batch_size,
        max_length=spec["max_tokens"],
    )
    problem = corpus.SyntheticProblem(pairs)
    batches, _ = builds.fixed_batches(problem, hp, count, args.seed)
    batches = [{k: v.numpy() for k, v in b.items()} for b in batches]
    corpus.save_batches(spec["batches_path"], batches)
    padded = corpus.xla_batches(pairs, hp, count, args.seed)
    corpus.save_batches(spec["xla_batches_path"], padded)
    return batches


def prepare(args):
    """Work dir, data (batches, text corpus), the spec file workers read."""
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="bench_peers_")
    os.makedirs(args.work_dir, exist_ok=True)
    spec = model_spec(args, args.work_dir)
    pairs = corpus.synthetic_pairs(
        args.corpus_sentences,
        args.vocab_size,
        args.mean_length,
        args.max_length,
        args.seed,
    )
    batches = make_batches(args, spec, pairs)
    paths = corpus.write_text_corpus(
        pairs, args.vocab_size, os.path.join(args.work_dir, "corpus")
    )
    spec_path = os.path.join(args.work_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    return spec, spec_path, batches, paths


# --- the rounds ---------------------------------------------------------------------


def measure_once(name, args, spec, paths, handles, round_index):
    """One round of config `name`: --updates updates timed (a worker's segment, or a
    fresh onmt-main run)."""
    if name == "opennmt_f32":
        run_dir = os.path.join(args.work_dir, "opennmt", f"round{round_index}")
        return opennmt.run_opennmt(
            spec, paths, run_dir, args.venv, args.opennmt_warmup, args.updates
        )
    segment = handles[name].ask("run")
    if "error" in segment:
        raise RuntimeError(segment["error"])
    return segment


def run_rounds(args, spec, paths, handles, results):
    """harness.interleave over the configs still standing: each trains --updates
    updates per round, in a rotating order."""

    def run_one(name, round_index):
        result = results[name]
        if result.status != "measured":
            return
        try:
            result.add(measure_once(name, args, spec, paths, handles, round_index))
        except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
            result.fail(workers.error_line(exc))
        outcome = (
            f"{result.rates[-1]:.0f} tokens/s"
            if result.status == "measured"
            else result.reason
        )
        print(f"  round {round_index + 1} {name}: {outcome}", flush=True)

    harness.interleave(args.configs, args.rounds, run_one, label="round")


# --- the report ---------------------------------------------------------------------


def describe_data(batches, spec):
    rows = sum(len(b["targets"]) for b in batches)
    return (
        f"corpus of {spec['corpus_sentences']} sentence pairs, vocab "
        f"{spec['vocab_size']}; t2t_lite/Keras batches: {len(batches)} micro-batches "
        f"({len(batches) // spec['accumulate_steps']} updates of "
        f"{spec['accumulate_steps']}), {rows} sentence pairs, "
        f"{corpus.target_tokens(batches)} non-pad target tokens"
    )


def print_report(report):
    """The harness's table of tokens/s, then every t2t_lite/peer ratio."""
    s, peak = report["setup"], report["peak_flops"]
    harness.print_table(
        "Training throughput, non-pad target tokens (EOS included) per second "
        "(OpenNMT-tf: its logged target tokens/s)",
        report["rows"],
        "tokens/s",
        "t2t_f32",
        TABLE_COLUMNS,
    )
    print(
        f"\nmodel: {s['num_layers']}+{s['num_layers']} layers, hidden "
        f"{s['hidden_size']}, filter {s['filter_size']}, {s['num_heads']} heads; "
        f"{report['data']}; {report['rounds']} rounds x {report['updates']} updates"
    )
    print(
        f"peak tf.matmul {report['peak_size']}^2: float32 {peak['float32'] / 1e9:.0f} GFLOP/s, "
        f"bfloat16 {peak['bfloat16'] / 1e9:.0f} GFLOP/s; "
        f"{report['flops_per_target_token'] / 1e6:.1f} MFLOP per target token; "
        "tok/update: target tokens per update; warmup s: build + warmup, all "
        "workers at once."
    )
    print("\nratios (median over rounds of per-round tokens/s ratios):")
    for pair, value in report["ratios"].items():
        print(f"  {pair:<24} {value:.2f}x")


def start_configs(args, spec_path, results):
    """The workers of the in-process configs, warmed up; OpenNMT marked skipped when
    its venv is missing."""
    if "opennmt_f32" in results and not os.path.exists(opennmt.opennmt_main(args.venv)):
        results["opennmt_f32"].fail(
            f"no OpenNMT-tf venv at {args.venv}: run with --setup_opennmt first",
            status="skipped",
        )
    in_process = [n for n in args.configs if not n.startswith("opennmt")]
    return workers.start_workers(in_process, spec_path, args.work_dir, results)


def run_benchmark(args):
    spec, spec_path, batches, paths = prepare(args)
    print(f"data: {describe_data(batches, spec)}; work dir {args.work_dir}", flush=True)
    results = {name: Result(name) for name in args.configs}
    handles = start_configs(args, spec_path, results)
    try:
        peaks = flops.measure_peaks(size=args.peak_size)
        run_rounds(args, spec, paths, handles, results)
    finally:
        for handle in handles.values():
            handle.close()
    peaks = flops.measure_peaks(peaks, size=args.peak_size)
    total, tokens = flops.training_flops(batches, spec)
    summaries = {
        n: results[n].summary(total / tokens, peaks)
        if n in results
        else {"status": "skipped", "dtype": DTYPES[n], "reason": "not in --configs"}
        for n in ALL_CONFIGS
    }
    return {
        "benchmark": "bench_peers",
        "smoke": args.smoke,
        "environment": harness.environment(),
        "data": describe_data(batches, spec),
        "setup": {k: v for k, v in spec.items() if not k.endswith("batches_path")},
        "rounds": args.rounds,
        "updates": args.updates,
        "flops_per_target_token": total / tokens,
        "peak_flops": peaks,
        "peak_size": args.peak_size,
        "configs": summaries,
        "ratios": ratios(summaries),
        "rows": table_rows({n: summaries[n] for n in args.configs}),
    }


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.setup_opennmt:
        opennmt.setup_opennmt(args.venv)
        return
    start = time.perf_counter()
    harness.print_start()
    report = run_benchmark(args)
    print_report(report)
    print(
        f"\ntotal wall time {time.perf_counter() - start:.0f}s, "
        f"load average at end: {harness.load_average()}"
    )
    harness.write_json(
        args.json, "bench_peers", report["rows"], "tokens/s", "t2t_f32", report=report
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
