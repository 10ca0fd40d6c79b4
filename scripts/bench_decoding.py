"""Benchmark: decoding speed (sentences/s) with and without the key/value cache.

Cached decoding (use_cache=true, the default) runs one position per step through
Transformer.decode_step, reusing the earlier positions' self-attention keys/values
and the encoder-side keys/values; uncached decoding (use_cache=false) re-runs
Transformer.decode over the whole prefix at every step, like T2T's slow path, so its
cost per sentence grows with the square of the output length. Side by side in one
process, for greedy search and beam 4 (alpha 0.6):

  1. Real translation: transformer_tiny trained on translate_numbers_en_fr by
     builds.train_numbers_model, the function tests/conftest.py's numbers_run
     fixture also calls (3000/200 pairs, 300 steps, in a temp dir, ~20 s), or an
     existing run (--output_dir and --data_dir, e.g. runs/quickstart_numbers and
     data/numbers_en_fr). Decoder.translate (SentencePiece included) of the first
     --sentences dev sentences, 32 a batch; cached and uncached must agree.
  2. Long outputs: untrained transformer_tiny and transformer_base (vocab 8000,
     dropout off at inference), one batch of random 20-token sources, extra_length
     set so that outputs are --lengths tokens long: an untrained model almost never
     emits EOS, so the search runs that many steps (the table shows the lengths
     seen). transformer_base uses --base_batch sentences and --base_repeats
     repetitions to stay affordable on 2 cores.

Method: each configuration's first call (tf.function tracing, oneDNN kernels) is
timed apart and reported as "1st call" (part 2: one sentence, as the slow uncached
calls are not worth paying twice). Then one call per configuration and repetition
is timed, interleaved in a rotating order so that other load on the machine hits all
alike. Rates are medians over repetitions; speedup is the median over repetitions
of uncached time / cached time. The report is the harness's table, a row per
(part, model, search) with the cached rate first and the uncached one, the speedup
and the rest as columns; its title notes whether TF_ENABLE_ONEDNN_OPTS=0 was set
(oneDNN's fused attention kernels change the uncached cost a lot). --json writes the
rows.

Run (from the repository root):

  python scripts/bench_decoding.py                 # ~7 min on 2 idle cores
  python scripts/bench_decoding.py --skip_base     # ~4 min
  TF_ENABLE_ONEDNN_OPTS=0 python scripts/bench_decoding.py   # ~2 min
  python scripts/bench_decoding.py --output_dir=runs/quickstart_numbers \\
      --data_dir=data/numbers_en_fr --skip_long
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf
from benchkit import builds, harness

from t2t_lite.decoding.decoder import Decoder, decode_hparams
from t2t_lite.decoding.loading import load_for_decoding

SEARCHES = (("greedy", 1), ("beam4", 4))
SOURCE_LENGTH = 20  # part 2: tokens per random source, EOS included
VOCAB_SIZE = 8000  # part 2


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--output_dir", default="", help="Existing numbers run (part 1).")
    p.add_argument("--data_dir", default="", help="Its data dir (with --output_dir).")
    p.add_argument("--sentences", type=int, default=200, help="Dev sentences.")
    p.add_argument("--repeats", type=int, default=3, help="Part 1 repetitions.")
    p.add_argument("--skip_long", action="store_true", help="Skip part 2.")
    p.add_argument("--long_batch", type=int, default=16, help="Part 2, tiny.")
    p.add_argument("--long_repeats", type=int, default=3, help="Part 2, tiny.")
    p.add_argument("--lengths", default="32,96", help="Part 2 output lengths.")
    p.add_argument("--skip_base", action="store_true", help="No transformer_base.")
    p.add_argument("--base_batch", type=int, default=4, help="Part 2, base.")
    p.add_argument("--base_repeats", type=int, default=1, help="Part 2, base.")
    p.add_argument("--seed", type=int, default=1)
    harness.add_json_flag(p)
    args = p.parse_args(argv)
    args.lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    if bool(args.output_dir) != bool(args.data_dir):
        p.error("give --output_dir and --data_dir together.")
    if any(n <= SOURCE_LENGTH for n in args.lengths):
        p.error(f"--lengths must exceed the source length {SOURCE_LENGTH}.")
    return args


class Pair:
    """A cached and an uncached configuration: their first-call times, per-repetition
    times and last outputs, as dicts keyed by use_cache."""

    def __init__(self):
        self.first, self.times, self.outputs = {}, {True: [], False: []}, {}


def measure_pairs(model, max_input_length, cases, repeats, label, run, warm=None):
    """cases: {key: decode hparams}; run(decoder) / warm(decoder) -> best outputs.
    Builds a cached and an uncached Decoder per case, times every first call (warm),
    then `repeats` repetitions of run, interleaved in a rotating order so other load
    on the machine hits all alike. Returns {key: Pair}."""
    pairs, decoders = {key: Pair() for key in cases}, []
    for key, overrides in cases.items():
        for cache in (True, False):
            dhp = decode_hparams(f"{overrides},use_cache={cache}")
            decoders.append((key, cache, Decoder(model, dhp, max_input_length)))
    for key, cache, decoder in decoders:
        start = time.perf_counter()
        (warm or run)(decoder)
        pairs[key].first[cache] = time.perf_counter() - start

    def run_one(case, _):
        key, cache, decoder = case
        start = time.perf_counter()
        pairs[key].outputs[cache] = run(decoder)
        pairs[key].times[cache].append(time.perf_counter() - start)

    harness.interleave(decoders, repeats, run_one, label)
    return pairs


def row(part, model, search, pair, lengths):
    """A table row (harness schema): cached sentences/s per repetition, with the
    uncached rate, the speedup and the rest as columns; lengths: the output lengths
    seen."""
    cached, uncached = pair.times[True], pair.times[False]
    n = len(pair.outputs[True])
    same = sum(a == b for a, b in zip(pair.outputs[True], pair.outputs[False]))
    label = f"{part} {model} {search}"
    (result,) = harness.summary_rows({label: [n / t for t in cached]})
    result.update(
        {
            "out tokens": f"{statistics.mean(lengths):.1f} ({min(lengths)}-{max(lengths)})",
            "sents x reps": f"{n}x{len(cached)}",
            "1st call s c/u": f"{pair.first[True]:.1f}/{pair.first[False]:.1f}",
            "uncached sent/s": n / statistics.median(uncached),
            "uncached spread": harness.percent(
                harness.spread([n / t for t in uncached])
            ),
            "speedup": statistics.median(u / c for c, u in zip(cached, uncached)),
            "identical": f"{'yes' if same == n else 'NO'} ({same}/{n})",
        }
    )
    return result


# --- part 1: real translation --------------------------------------------------------


def bench_translation(args, output_dir, data_dir):
    model, problem, hp, path = load_for_decoding(
        output_dir=output_dir,
        data_dir=data_dir,
        **dict.fromkeys(("checkpoint_path", "problem", "model", "hparams_set"), ""),
        hparams="",
    )
    sources, references = problem.dev_text()
    sources, references = sources[: args.sentences], references[: args.sentences]
    print(f"part 1: {len(sources)} dev sentences, checkpoint {path}", flush=True)

    def run(decoder):
        results = decoder.translate(sources, problem.encode_inputs, problem.decode)
        return [hyps[0][0] for hyps in results]

    cases = {s: f"beam_size={b},alpha=0.6,batch_size=32" for s, b in SEARCHES}
    max_input_length = hp.max_length or hp.batch_size
    pairs = measure_pairs(model, max_input_length, cases, args.repeats, "part 1", run)
    rows = []
    for search, pair in pairs.items():
        best = pair.outputs[True]
        lengths = [len(problem.target_vocab.encode_one(t)) - 1 for t in best]
        exact = sum(o == r for o, r in zip(best, references))
        print(f"part 1 {search}: {exact}/{len(best)} translations = the reference")
        rows.append(row("numbers", "tiny", search, pair, lengths))
    return rows


# --- part 2: long outputs, untrained models ------------------------------------------


def bench_long(hparams_set, batch, repeats, args):
    hp = builds.hparams(hparams_set)
    model = builds.build_seeded_model(hp, VOCAB_SIZE, args.seed)
    rng = np.random.default_rng(args.seed)
    sources = [
        rng.integers(2, VOCAB_SIZE, SOURCE_LENGTH - 1).tolist() + [1]
        for _ in range(batch)
    ]
    cases = {
        (n, search): f"beam_size={beam},alpha=0.6,batch_size={batch},"
        f"extra_length={n - SOURCE_LENGTH}"
        for n in args.lengths
        for search, beam in SEARCHES
    }
    name = hparams_set.replace("transformer_", "")

    def run(decoder):
        return [hyps[0].ids for hyps in decoder.decode_ids(sources)]

    def warm(decoder):  # traces; the uncached runs are too slow to pay for twice
        return decoder.decode_ids(sources[:1])

    label = f"part 2 {name}"
    pairs = measure_pairs(model, hp.max_length, cases, repeats, label, run, warm)
    rows = []
    for (n, search), pair in pairs.items():
        lengths = [len(ids) for ids in pair.outputs[True] + pair.outputs[False]]
        rows.append(row(f"long {n}", name, search, pair, lengths))
    return rows


# --- report --------------------------------------------------------------------------

COLUMNS = (
    "uncached sent/s",
    "uncached spread",
    "speedup",
    "out tokens",
    "sents x reps",
    "1st call s c/u",
    "identical",
)


def report(rows, started, json_path):
    """The harness's table (rows: cached sentences/s, the uncached numbers and the
    speedup as columns), its legend, and --json."""
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset (on)")
    title = (
        "Decoding speed with (cached) and without (uncached) the key/value cache, "
        f"sentences per second; TF_ENABLE_ONEDNN_OPTS={onednn}"
    )
    note = (
        "medians over repetitions (sents x reps); spread: (max - min) / median of "
        "the repetitions' rates; speedup: median over repetitions of uncached time / "
        "cached time"
    )
    harness.print_table(title, rows, "sent/s cached", columns=COLUMNS, note=note)
    print(
        "out tokens: mean (min-max) output tokens, EOS and padding removed (part 2: "
        "cached and uncached outputs).\n1st call: first call's seconds, cached/"
        "uncached (tracing included; part 2: one sentence).\nidentical: cached and "
        "uncached best outputs equal, per sentence.\n"
        f"total wall time {time.perf_counter() - started:.0f}s"
    )
    harness.write_json(
        json_path, "bench_decoding", rows, "sent/s cached", onednn_opts=onednn
    )


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    tf.get_logger().setLevel("ERROR")  # one tf.function per Decoder: retrace warnings
    harness.print_start()
    with tempfile.TemporaryDirectory() as root:
        if args.output_dir:
            output_dir, data_dir = args.output_dir, args.data_dir
        else:
            data_dir, output_dir, _ = builds.train_numbers_model(root)
            print(f"trained the numbers model in {time.perf_counter() - started:.0f}s")
        rows = bench_translation(args, output_dir, data_dir)
    if not args.skip_long:
        rows += bench_long("transformer_tiny", args.long_batch, args.long_repeats, args)
        if not args.skip_base:
            rows += bench_long(
                "transformer_base", args.base_batch, args.base_repeats, args
            )
    report(rows, started, args.json)


if __name__ == "__main__":
    main()
