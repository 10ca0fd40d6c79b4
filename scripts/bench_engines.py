"""Benchmark: one trained model translated by four engines, side by side —
t2t-decoder's TensorFlow search, the SavedModel of t2t-exporter, and CTranslate2
(t2t-exporter --format=ctranslate2) with float32 and int8 weights: sentences/s,
BLEU, and the time from checkpoint to a converted model.

Same sentences, same beam, length penalty alpha and batch size for all. The model:
an existing run (--output_dir, --data_dir; its problem's dev set, or --source and
--reference files), or by default transformer_tiny trained on
translate_numbers_en_fr by builds.train_numbers_model (~20 s).

Method. Each configuration runs in a fresh process (`--worker`), which loads its
engine, translates the first batch once untimed (tracing, first-touch allocations:
reported as "load + 1st batch"), then times the translation of all the sentences.
The configurations take turns for --rounds rounds, in a rotating order
(harness.interleave), so other load on the machine hits all alike; the speed ratio
to TensorFlow is the median over rounds of the per-round ratio. Every engine may use
the whole machine: TensorFlow its default thread pools, CTranslate2 --threads
(default: the cores this process may run on). CTranslate2 ranks beams with its own
length penalty (length^alpha, T2T's is ((5 + length) / 6)^alpha): the BLEU column
shows what that costs or gains.

Run (from the repository root):

  python scripts/bench_engines.py                        # numbers, ~5 min
  python scripts/bench_engines.py --output_dir=RUN --data_dir=DATA --sentences=500
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from benchkit import builds, harness

from t2t_lite.decoding.bleu import corpus_scores

ENGINES = ("tensorflow", "savedmodel", "ct2_float32", "ct2_int8")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--output_dir", default="", help="a trained run (default: train)")
    p.add_argument("--data_dir", default="", help="its data dir")
    p.add_argument("--source", default="", help="sentences (default: the dev set)")
    p.add_argument("--reference", default="", help="their translations")
    p.add_argument("--sentences", type=int, default=500, help="at most this many")
    p.add_argument("--beam_size", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--work_dir", default="")
    harness.add_json_flag(p)
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if bool(args.output_dir) != bool(args.data_dir):
        p.error("give --output_dir and --data_dir together.")
    if bool(args.source) != bool(args.reference):
        p.error("give --source and --reference together.")
    args.engines = args.engines.split(",")
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        p.error(f"unknown engine(s) {sorted(unknown)}; known: {', '.join(ENGINES)}")
    return args


def decode_hparams(args):
    return f"beam_size={args.beam_size},alpha={args.alpha},batch_size={args.batch_size}"


# --- the worker: one engine in a fresh process ------------------------------------------


def _translate_function(engine, job):
    """(translate(lines) -> texts) for one engine, its model loaded."""
    from t2t_lite.decoding.decoder import Decoder
    from t2t_lite.decoding.decoder import decode_hparams as parse
    from t2t_lite.decoding.loading import load_for_decoding, open_for_decoding

    run = {"output_dir": job["output_dir"], "data_dir": job["data_dir"]}
    dhp = parse(job["decode_hparams"])
    if engine == "savedmodel":
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (the SentencePiece ops)

        signature = tf.saved_model.load(job["dirs"][engine]).signatures[
            "serving_default"
        ]

        def translate(lines):
            result = signature(sentences=tf.constant(lines, tf.string))
            return [t.decode("utf-8") for t in result["translations"].numpy()]

        return translate
    if engine == "tensorflow":
        model, problem, hp, _ = load_for_decoding(**run)
        decoder = Decoder(model, dhp, hp.max_length or hp.batch_size)
    else:
        from t2t_lite.decoding.ctranslate2_engine import CTranslate2Decoder

        _, problem, hp, _, _ = open_for_decoding(**run)
        decoder = CTranslate2Decoder(
            job["dirs"][engine],
            dhp,
            hp.max_length or hp.batch_size,
            problem,
            threads=job["threads"],
        )

    def translate(lines):
        results = decoder.translate(lines, problem.encode_inputs, problem.decode)
        return [hyps[0][0] for hyps in results]

    return translate


def worker(args):
    job = json.loads(args.worker)
    started = time.perf_counter()
    translate = _translate_function(job["engine"], job)
    lines = job["lines"]
    translate(lines[: args.batch_size])  # untimed: tracing, first allocations
    warm = time.perf_counter() - started
    started = time.perf_counter()
    texts = translate(lines)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "warm": warm, "texts": texts}))


# --- the driver --------------------------------------------------------------------------


def exporter(args, output_dir, data_dir, export_dir, *flags):
    """Runs t2t-exporter in a fresh process; returns its wall seconds."""
    started = time.perf_counter()
    harness.run_python(
        [
            "-m",
            "t2t_lite.bin.exporter",
            f"--output_dir={output_dir}",
            f"--data_dir={data_dir}",
            f"--export_dir={export_dir}",
            *flags,
        ]
    )
    return time.perf_counter() - started


def export_all(args, output_dir, data_dir, root):
    dirs = {engine: os.path.join(root, engine) for engine in ENGINES[1:]}
    wall = {
        "savedmodel": exporter(
            args,
            output_dir,
            data_dir,
            dirs["savedmodel"],
            f"--decode_hparams={decode_hparams(args)}",
        ),
        "ct2_float32": exporter(
            args, output_dir, data_dir, dirs["ct2_float32"], "--format=ctranslate2"
        ),
        "ct2_int8": exporter(
            args,
            output_dir,
            data_dir,
            dirs["ct2_int8"],
            "--format=ctranslate2",
            "--quantization=int8",
        ),
    }
    return dirs, wall


def sentences(args, output_dir, data_dir):
    if args.source:
        with open(args.source, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f]
        with open(args.reference, encoding="utf-8") as f:
            refs = [line.rstrip("\n") for line in f]
    else:
        from t2t_lite.decoding.loading import open_for_decoding

        run = {"output_dir": output_dir, "data_dir": data_dir}
        _, problem, _, _, _ = open_for_decoding(**run)
        lines, refs = problem.dev_text()
    return list(lines[: args.sentences]), list(refs[: args.sentences])


def dir_megabytes(path):
    total = sum(
        os.path.getsize(os.path.join(d, name))
        for d, _, names in os.walk(path)
        for name in names
    )
    return total / 2**20


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    harness.print_start()
    root = args.work_dir or tempfile.mkdtemp(prefix="t2t_bench_engines_")
    output_dir, data_dir = args.output_dir, args.data_dir
    if not output_dir:
        print("training transformer_tiny on translate_numbers_en_fr ...", flush=True)
        data_dir, output_dir, _ = builds.train_numbers_model(root)
    lines, refs = sentences(args, output_dir, data_dir)
    dirs, export_wall = export_all(args, output_dir, data_dir, root)
    print(f"{len(lines)} sentences; {decode_hparams(args)}", flush=True)
    job = {
        "output_dir": output_dir,
        "data_dir": data_dir,
        "decode_hparams": decode_hparams(args),
        "threads": args.threads,
        "dirs": dirs,
        "lines": lines,
    }
    results = {engine: [] for engine in args.engines}

    def run_one(engine, _):
        spec = json.dumps({**job, "engine": engine})
        stdout, _ = harness.run_python([__file__, "--worker", spec, *_flags(args)])
        results[engine].append(harness.last_json(stdout))

    harness.interleave(args.engines, args.rounds, run_one, label="engines")
    report(args, results, refs, dirs, export_wall)
    return 0


def _flags(args):
    return [f"--batch_size={args.batch_size}"]


def report(args, results, refs, dirs, export_wall):
    """The harness's table of sentences/s (ratio to TensorFlow's) with each engine's
    BLEU, load time, export time and size; then agreement with TensorFlow's text."""
    rates = {e: [len(refs) / r["seconds"] for r in runs] for e, runs in results.items()}
    rows = harness.summary_rows(rates, "tensorflow")
    summary = {}
    for row in rows:
        engine, runs = row["config"], results[row["config"]]
        bleu = corpus_scores(runs[0]["texts"], refs).bleu
        same = all(r["texts"] == runs[0]["texts"] for r in runs)
        wall = export_wall.get(engine)
        size = dir_megabytes(dirs[engine]) if engine in dirs else float("nan")
        row["BLEU"] = f"{bleu:.2f}{'' if same else ' (varies)'}"
        row["load + 1st batch s"] = f"{statistics.median(r['warm'] for r in runs):.1f}"
        row["checkpoint → model s"] = "" if wall is None else f"{wall:.1f}"
        row["size MB"] = f"{size:.1f}"
        summary[engine] = {"rate": row["median"], "ratio": row["ratio"], "bleu": bleu}
    columns = ("BLEU", "load + 1st batch s", "checkpoint → model s", "size MB")
    title = "Decoding speed by inference engine, sentences per second"
    harness.print_table(title, rows, "sentences/s", "tensorflow", columns)
    if "tensorflow" in results:
        tf_texts = results["tensorflow"][0]["texts"]
        for engine, runs in results.items():
            agree = sum(a == b for a, b in zip(runs[0]["texts"], tf_texts))
            print(f"{engine}: {agree}/{len(tf_texts)} translations = TensorFlow's")
    harness.write_json(
        args.json, "bench_engines", rows, "sentences/s", "tensorflow", summary=summary
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
