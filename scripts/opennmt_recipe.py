"""OpenNMT-tf's `--auto_config` as one more row of scripts/bench_recipes.py's table:
the same corpus, pieces, model sizes, core and training time as a t2t_lite recipe
there, evaluated at the same marks.

Data: the training text the data dir was made from (--train_source/--train_target,
by default the files its manifest names) and its raw dev text, cut into pieces by
its SentencePiece model; OpenNMT's vocabulary is that model's pieces
(`onmt-build-vocab --from_format sentencepiece`). Training: `onmt-main --auto_config
train` (OpenNMT-tf 2.32 in bench_peers' venv) pinned to --core, auto_config untouched
(LazyAdam 0.9/0.998, Noam with 8000 warmup updates, 3072-token batches accumulated to
25000 tokens an update, label smoothing 0.1, examples over 100 pieces dropped); the
config adds only data paths, model_dir, a max_step out of reach, a log line and a
checkpoint every update.

The clock is t2t_lite's (benchkit/recipes/runs.py's ClockMarks): training time runs from the first
update's log line (start-up excluded; that update, which traces, counts as long as
the second), checkpoint writes off it (each "Saved checkpoint" line's time after its
update's line). At each of --marks
evenly spaced marks up to --minutes the newest checkpoint saved at or before it is
kept (the others are deleted as training goes); past the last mark onmt-main is
stopped (SIGINT, SIGTERM, SIGKILL). Tokens trained on: the log's target tokens/s
times each update's time (OpenNMT logs none for its first two updates: they count
as the mean update). Then, on the same core, opennmt_evaluate.py gives each mark's
dev loss both ways (t2t_lite's, label-smoothed, the number bench_recipes reports;
OpenNMT's own, unsmoothed) and greedy translations of --bleu_sentences dev sentences,
plus beam 4 with length penalty 0.6 (bench_recipes' final decode) at the last mark,
scored by t2t_lite's sacrebleu BLEU against the raw dev target.

Output: WORK_DIR/result.json in bench_recipes' run format (recipe "opennmt_auto") and a
table; with --compare_with (a bench_recipes --work_dir with the same marks) its
report with this run added, also in WORK_DIR/report.md. Bad input: one line, exit 2.

  python scripts/opennmt_recipe.py --data_dir=data/ende_10k --minutes=25 --marks=5 \\
      --core=1 --random_seed=2 --bleu_sentences=100 --compare_with=/tmp/t2t_bench_recipes
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys

from benchkit.peers import opennmt as onmt
from benchkit.recipes import report as recipe_report

RECIPE = "opennmt_auto"
DATA = "translate_parallel_text"
EVALUATOR = os.path.join(os.path.dirname(__file__), "opennmt_evaluate.py")
BEAM = {"beam_width": 4, "length_penalty": 0.6}  # bench_recipes' beam_size=4,alpha=0.6
EXTRA_LENGTH = 50  # decoding stops 50 pieces past the longest input, as T2T's
LABEL_SMOOTHING = 0.1  # in t2t_lite's dev loss (bench_recipes' sets keep T2T's 0.1)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--data_dir", required=True, help="t2t-datagen's, translate_parallel_text")
    add("--train_source", default="", help="default: the manifest's")
    add("--train_target", default="", help="default: the manifest's")
    add("--minutes", type=float, default=25.0, help="training time")
    add("--marks", type=int, default=10, help="evaluated checkpoints")
    add("--core", type=int, default=0, help="taskset -c CORE: training, evaluation")
    add("--bleu_sentences", type=int, default=500)
    add("--random_seed", type=int, default=1)
    add("--num_layers", type=int, default=3, help="encoder and decoder layers each")
    add("--hidden_size", type=int, default=256)
    add("--filter_size", type=int, default=1024)
    add("--num_heads", type=int, default=4)
    add("--dropout", type=float, default=0.1)
    add("--venv", default=onmt.DEFAULT_VENV, help="bench_peers.py --setup_opennmt's")
    add("--work_dir", default="/tmp/t2t_opennmt_recipe")
    add("--compare_with", default="", help="a bench_recipes --work_dir")
    add("--reference", default="fixed4", help="its reference recipe")
    add("--keep_checkpoints", action="store_true")
    return p.parse_args(argv)


def fail(message):
    print(f"opennmt_recipe.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    """One line and exit 2 for each mistake, before anything is written; fills in
    the training text. Returns the --compare_with runs."""
    sizes = (args.num_layers, args.hidden_size, args.filter_size, args.num_heads)
    if args.minutes <= 0 or min(args.marks, args.bleu_sentences, *sizes) < 1:
        fail("--minutes must be > 0; --marks, --bleu_sentences and the sizes >= 1.")
    if args.core not in os.sched_getaffinity(0):
        fail(f"--core {args.core}: not one of {sorted(os.sched_getaffinity(0))}.")
    if not os.path.exists(onmt.opennmt_main(args.venv)):
        fail(f"no OpenNMT-tf in {args.venv}: run bench_peers.py --setup_opennmt.")
    try:
        with open(os.path.join(args.data_dir, f"{DATA}.manifest.json")) as f:
            corpus = json.load(f)["identity"]["corpus"]["train"][0]
    except (OSError, ValueError, KeyError, IndexError):
        fail(f"--data_dir {args.data_dir}: no t2t-datagen {DATA} data there.")
    for name in (".vocab.model", "-dev.source.txt", "-dev.target.txt"):
        if not os.path.isfile(os.path.join(args.data_dir, DATA + name)):
            fail(f"--data_dir {args.data_dir}: no {DATA}{name} there.")
    for flag, made_from in zip(("train_source", "train_target"), corpus):
        path = getattr(args, flag) or made_from["path"]
        if not os.path.isfile(path) or os.path.getsize(path) != made_from["bytes"]:
            fail(f"--{flag} {path}: not the file {args.data_dir} was made from.")
        setattr(args, flag, path)
    if not args.compare_with:
        return []
    results = []
    for path in sorted(glob.glob(f"{args.compare_with}/runs/*/result.json")):
        with open(path) as f:
            results.append(json.load(f))
    marks = [[m["mark_seconds"] for m in r["marks"]] for r in results if "marks" in r]
    if not marks or any(m != mark_seconds(args) for m in marks):
        fail(f"--compare_with {args.compare_with}: no runs with these marks there.")
    return results


def mark_seconds(args):
    """bench_recipes' marks: --marks evenly spaced up to --minutes, in seconds."""
    total = args.minutes * 60
    return [round(total * (i + 1) / args.marks, 3) for i in range(args.marks)]


# --- what onmt-main reads ----------------------------------------------------------


def read_lines(path):
    with open(path, encoding="utf-8-sig") as f:
        return [line.strip() for line in f]


def write_text(args, sp, text_dir):
    """{name: path} of the pieces onmt-main reads (training pairs with an empty side
    dropped, as t2t-datagen drops them) and of its vocabulary, built from an export
    of the model's pieces (the data dir's .vocab.vocab is "id<TAB>piece", which
    onmt-build-vocab's sentencepiece format would misread)."""
    train = zip(read_lines(args.train_source), read_lines(args.train_target))
    train = [pair for pair in train if all(pair)]
    texts = {"train_source": [s for s, _ in train]}
    texts["train_target"] = [t for _, t in train]
    for side in ("source", "target"):
        texts[f"dev_{side}"] = read_lines(f"{args.data_dir}/{DATA}-dev.{side}.txt")
    texts["bleu_source"] = texts["dev_source"][: args.bleu_sentences]
    os.makedirs(text_dir)
    paths = {name: os.path.join(text_dir, f"{name}.txt") for name in texts}
    for name, lines in texts.items():
        with open(paths[name], "w") as f:
            f.writelines(" ".join(p) + "\n" for p in sp.encode(lines, out_type=str))
    pieces, paths["vocab"] = (os.path.join(text_dir, n) for n in ("spm.vocab", "vocab"))
    lines = (f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n" for i in range(len(sp)))
    with open(pieces, "w") as f:
        f.writelines(lines)
    command = [os.path.join(args.venv, "bin", "onmt-build-vocab"), "--from_vocab"]
    command += [pieces, "--from_format=sentencepiece", "--save_vocab", paths["vocab"]]
    subprocess.run(command, check=True, capture_output=True, env=onmt.opennmt_env())
    return paths


def write_run_files(args, paths, run_dir):
    """(model file, config file, config): auto_config's values stay; the config adds
    data, model_dir, a max_step out of reach, a log line and a checkpoint every
    update (never swept by OpenNMT: the Clock deletes those no mark needs)."""
    os.makedirs(run_dir)
    model_path = os.path.join(run_dir, "model.py")
    with open(model_path, "w") as f:
        f.write(onmt.OPENNMT_MODEL.format(**vars(args)))
    data = {"train_features_file": paths["train_source"]}
    data["train_labels_file"] = paths["train_target"]
    data["source_vocabulary"] = data["target_vocabulary"] = paths["vocab"]
    every = {"save_summary_steps": 1, "save_checkpoints_steps": 1}
    train = {"max_step": 10**9, "keep_checkpoint_max": 10**9, **every}
    config = {"model_dir": os.path.join(run_dir, "model"), "data": data, "train": train}
    config_path = os.path.join(run_dir, "config.yml")
    with open(config_path, "w") as f:
        f.write(onmt.yaml_text(config))
    return model_path, config_path, config


# --- training ------------------------------------------------------------------------


class Clock:
    """Training time read from onmt-main's log lines as they come: from the first
    update's line (that update counted as long as the second), checkpoint writes
    off the clock. `updates` holds per update
    {updates, train_seconds, wall_seconds, cpu_seconds, tokens, learning_rate,
    checkpoint}. A checkpoint no mark needs (a newer one was saved before the next
    mark) goes to `discard` as soon as the newer one is saved."""

    def __init__(self, marks, discard):
        self.marks, self.discard = marks, discard
        self.updates, self.times = {}, {}  # step -> record, its line's time
        self.first = self.reset = self.cpu0 = self.kept = None
        self.save_seconds, self.saves, self.done = 0.0, 0, False

    def read(self, line, cpu):
        """Takes in a log line (`cpu`: onmt-main's CPU seconds); True when done."""
        if step := onmt.STEP_LINE.search(line):
            self._update(onmt.log_time(step[1]), int(step[2]), int(step[3]), line, cpu)
        elif saved := onmt.SAVED_LINE.search(line):
            self._saved(onmt.log_time(saved[1]), saved[2])
        return self.done

    def _update(self, now, step, rate, line, cpu):
        if self.first is None:
            self.first, self.cpu0 = now, cpu
        elif step - 1 == min(self.updates):  # the first (traced) as long as the second
            self.first -= now - self.reset
            first = self.updates[step - 1]
            first["train_seconds"] = round((now - self.reset).total_seconds(), 2)
        since = (now - self.first).total_seconds()
        self.updates[step] = {
            "updates": step,
            "train_seconds": round(since - self.save_seconds, 2),
            "wall_seconds": round(since, 2),
            "cpu_seconds": round(cpu - self.cpu0, 2),
            # the rate covers the time since the counters' reset after the last save
            "tokens": rate * (now - self.reset).total_seconds() if rate else None,
            "learning_rate": float(onmt.RATE.search(line)[1]),  # the next update's
            "checkpoint": None,
        }
        self.times[step], self.reset = now, now
        self.done = self.updates[step]["train_seconds"] >= self.marks[-1]

    def _saved(self, now, path):
        step = int(path.rsplit("-", 1)[1])
        self.save_seconds += (now - self.times[step]).total_seconds()
        self.saves, self.reset = self.saves + 1, now
        if self.kept:
            old, new = (self.updates[k]["train_seconds"] for k in (self.kept, step))
            if not any(old <= mark < new for mark in self.marks):
                self.discard(self.updates[self.kept]["checkpoint"])
                self.updates[self.kept]["checkpoint"] = None
        self.updates[step]["checkpoint"], self.kept = path, step


def delete_checkpoint(path):
    for name in glob.glob(path + ".*"):
        os.remove(name)


def train(args, model_path, config_path, log_path):
    """(Clock, log text) of onmt-main pinned to --core, run until the clock passes
    the last mark."""
    command = ["taskset", "-c", str(args.core), onmt.opennmt_main(args.venv)]
    command += ["--model", model_path, "--config", config_path, "--auto_config"]
    command += ["--seed", str(args.random_seed), "train"]
    clock = Clock(mark_seconds(args), delete_checkpoint)
    code, text = onmt.follow(command, log_path, clock.read)
    if not clock.done:
        tail = " | ".join(text.strip().splitlines()[-2:])[-300:]
        raise RuntimeError(f"onmt-main ended ({code}) before the last mark: {tail}")
    return clock, text


# --- evaluation ----------------------------------------------------------------------


def mark_records(clock, facts):
    """(bench_recipes' mark records, their checkpoints): at each mark the newest
    checkpoint saved at or before it. Micro-steps and tokens per update (padding
    included, planned, as t2t_lite counts them) from onmt-main's log."""
    updates = [clock.updates[step] for step in sorted(clock.updates)]
    logged = [u["tokens"] for u in updates if u["tokens"] is not None]
    unlogged = statistics.fmean(logged) if logged else 0.0
    records, checkpoints = [], []
    for mark in clock.marks:
        saved = [u for u in updates if u["checkpoint"] and u["train_seconds"] <= mark]
        if not saved:
            raise RuntimeError(
                f"no checkpoint by the mark at {mark} s: marks too dense"
            )
        end = saved[-1]
        keys = ("train_seconds", "wall_seconds", "cpu_seconds", "updates")
        tokens = [u["tokens"] for u in updates if u["updates"] <= end["updates"]]
        records.append({"mark_seconds": mark, **{k: end[k] for k in keys}})
        records[-1].update(
            micro_steps=end["updates"] * facts["accumulate"],
            tokens_seen=round(sum(unlogged if t is None else t for t in tokens)),
            tokens_per_update=facts["accumulate"] * facts["batch_size"],
            learning_rate=end["learning_rate"],
        )
        checkpoints.append(end["checkpoint"])
    return records, checkpoints


def evaluate(args, sp, spec, records):
    """Adds opennmt_evaluate.py's dev losses and the BLEU of its translations to
    `records`; returns what they were measured on."""
    out = spec["output_dir"]
    os.makedirs(out)
    with open(os.path.join(out, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)
    python = os.path.join(args.venv, "bin", "python")
    command = ["taskset", "-c", str(args.core), python, EVALUATOR, f.name]
    with open(os.path.join(out, "evaluate.log"), "w") as log:
        command.append(os.path.join(out, "numbers.json"))
        env = onmt.opennmt_env()
        run = subprocess.run(command, stdout=log, stderr=log, env=env, check=False)
    if run.returncode:
        raise RuntimeError(f"opennmt_evaluate.py failed ({run.returncode}): {log.name}")
    from t2t_lite.decoding.bleu import corpus_scores  # imports TensorFlow: only now

    references = read_lines(f"{args.data_dir}/{DATA}-dev.target.txt")
    references = references[: args.bleu_sentences]

    def bleu(path):
        hypotheses = [sp.decode(line.split()) for line in read_lines(path)]
        return round(corpus_scores(hypotheses, references).bleu, 2)

    with open(command[-1]) as f:
        numbers = json.load(f)
    for record, measured in zip(records, numbers):
        record["dev_loss"] = round(measured["dev_loss"], 5)
        record["dev_loss_opennmt"] = round(measured["dev_loss_opennmt"], 5)
        record["bleu"] = bleu(measured["greedy_file"])
        if "beam_file" in measured:
            record["bleu_final_decode"] = bleu(measured["beam_file"])
    return {"dev_tokens": numbers[0]["dev_tokens"], "bleu_sentences": len(references)}


def run(args):
    """Text, training, evaluation: (the marks' records, facts about the run)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=f"{args.data_dir}/{DATA}.vocab.model")
    for name in ("text", "run"):  # an earlier run's
        shutil.rmtree(os.path.join(args.work_dir, name), ignore_errors=True)
    paths = write_text(args, sp, os.path.join(args.work_dir, "text"))
    run_dir = os.path.join(args.work_dir, "run")
    model_path, config_path, config = write_run_files(args, paths, run_dir)
    clock, text = train(args, model_path, config_path, f"{run_dir}/train.log")
    facts = onmt.run_facts(text)
    records, checkpoints = mark_records(clock, facts)
    longest = max(len(line.split()) for line in read_lines(paths["bleu_source"]))
    decode = {"maximum_decoding_length": longest + EXTRA_LENGTH}
    spec = {"model_file": model_path, "config": config, "checkpoints": checkpoints}
    spec.update({k: paths[k] for k in ("dev_source", "dev_target", "bleu_source")})
    spec.update(greedy={"beam_width": 1, **decode}, beam={**BEAM, **decode})
    spec.update(output_dir=f"{run_dir}/eval", label_smoothing=LABEL_SMOOTHING)
    measured_on = evaluate(args, sp, spec, records)
    if not args.keep_checkpoints:
        for path in glob.glob(f"{config['model_dir']}/ckpt-*"):
            os.remove(path)
    facts.update(measured_on, off_clock_seconds=round(clock.save_seconds, 2))
    facts["checkpoint_seconds_mean"] = round(clock.save_seconds / clock.saves, 3)
    return records, facts


def print_table(result):
    print(f"\n{RECIPE}, core {result['core']}, seed {result['seed']}:")
    if result["status"] != "ok":
        return print(result["error"])
    keys = ("mark_seconds", "train_seconds", "updates", "tokens_seen", "learning_rate")
    keys += ("dev_loss", "dev_loss_opennmt", "bleu", "bleu_final_decode")
    print(" | ".join(keys))
    for m in result["marks"]:
        print(" | ".join(f"{m[k]:.4g}" if k in m else "-" for k in keys))
    seconds = result["off_clock_seconds"], result["checkpoint_seconds_mean"]
    print("checkpoint writes (off the clock): {} s, {} s each".format(*seconds))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    compared = check_args(args)
    os.makedirs(args.work_dir, exist_ok=True)
    result = {"recipe": RECIPE, "hparams": "onmt-main --auto_config"}
    result.update(seed=args.random_seed, core=args.core, filler=False)
    try:
        records, facts = run(args)
        result.update(status="ok", marks=records, **facts)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        result.update(status="error", error=str(e).strip().splitlines()[0])
    with open(os.path.join(args.work_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)
    if compared:
        runs = compared + [result]
        recipes = {r["recipe"]: r["hparams"] for r in runs}
        summary = recipe_report.summarize(
            runs, recipes, args.reference, mark_seconds(args)
        )
        with open(os.path.join(args.work_dir, "report.md"), "w") as f:
            f.write(recipe_report.markdown(summary) + "\n")
        print("\n" + recipe_report.markdown(summary))
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
