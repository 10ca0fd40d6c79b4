"""The runs of scripts/bench_recipes.py: the parent's plumbing (the data, a group of
child processes each pinned to its core) and what each child does: train for a
time budget, then evaluate the weights saved at the budget's marks.

`prepare_data(args)` makes the data directory once with t2t-datagen.
`run_group(specs, script)` starts one child per job spec (a dict, see
bench_recipes.job_spec) with `taskset -c CORE python SCRIPT --child=SPEC.json`, waits
for all of them and returns their results. In the child, `child_main(path)` runs
`run(spec)` and writes its result (a dict) next to the spec as result.json:

- Training is t2t_lite's own loop, `Trainer(TrainerOptions(...), hp).train()`, with one
  extra hook, `ClockMarks`. Its clock (wall time, or the process's CPU time with
  spec["clock"] "cpu") starts when the loop begins (the model is built, the input
  iterators exist) and runs while the loop trains, less the one-off start (tracing
  the step functions, filling the shuffle buffer). When it passes a mark, the hook
  waits for the accumulation window in progress to close (so the weights hold every
  micro-batch counted), records the counters, writes the model's weights, and takes
  the time that took off the clock. After the last mark it ends the loop. The run
  never evaluates while it trains (local_eval_frequency=0) and never saves a full
  checkpoint.
- Evaluation comes after training, in the same process on the same core: dev loss and
  accuracy on the whole dev split and greedy BLEU on the first `bleu_sentences` dev
  sentences for every mark's weights, then BLEU with `final_decode_hparams` (beam
  search) for the last mark. No recipe's training time pays for any evaluation.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import tensorflow as tf

from benchkit import harness
from t2t_lite import registrations  # noqa: F401  (registers problems, models, sets)
from t2t_lite.decoding.decoder import decode_hparams
from t2t_lite.decoding.loading import restore_model
from t2t_lite.errors import first_line
from t2t_lite.hparams_checks import validate
from t2t_lite.registry import HPARAMS_SETS
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions
from t2t_lite.training.reporting.evaluation import BleuEvaluator

# Training runs until the clock says stop; train_steps only has to be out of reach
# (and a multiple of every window size, so no warning about an unfinished window).
NEVER = 2**40


def build_hparams(hparams_set, common, recipe, model="transformer"):
    """The set, the common overrides, then the recipe's (a key may repeat across the
    two strings: the recipe's value wins), range-checked as t2t-trainer does."""
    hp = HPARAMS_SETS.get(hparams_set)().parse(common).parse(recipe)
    return validate(hp, model)


class ClockMarks:
    """A trainer hook: a clock of training time that, at each of `seconds`
    (ascending) once the window in progress has closed, records the counters and
    writes the model's weights (DIRECTORY/mark-1, mark-2, ...), and ends the loop
    after the last mark. The clock is wall time, or with clock="cpu" the process's
    CPU time (what the run got of a core that other jobs share).

    Off the clock: its own work at marks, and the one-off start of training: the
    first step of each kind (accumulate, update) less the second one's time, i.e.
    the step functions' tracing and the first wait for input (the shuffle buffer
    filling), which a longer run would not repeat and which differ between recipes
    only in how many functions they trace."""

    def __init__(self, trainer, seconds, directory, clock="wall"):
        self.trainer, self.seconds, self.directory = trainer, list(seconds), directory
        self.clock = time.process_time if clock == "cpu" else time.perf_counter
        self.records, self.paths = [], []
        self._checkpoint = tf.train.Checkpoint(model=trainer.model)
        self.off_clock = 0.0  # seconds taken off the clock
        self._started = self._last = self._wall_started = self._cpu_started = None
        self._calls = {}  # steps seen of each kind (True: closes a window), up to 2

    def begin(self, loop):
        del loop
        self._started = self._last = self.clock()
        self._wall_started, self._cpu_started = time.perf_counter(), time.process_time()

    def after_step(self, loop):
        now = self.clock()
        step_seconds, self._last = now - self._last, now
        update = "window_tokens" in loop.out  # the step that closes a window
        calls = self._calls.get(update, 0)
        if calls < 2:  # the first step off the clock; a normal step's time put back
            self._calls[update] = calls + 1
            self.off_clock += step_seconds if calls == 0 else -step_seconds
        if not update:  # inside a window: its update is to come
            return
        trained = now - self._started - self.off_clock
        if trained < self.seconds[len(self.records)]:
            return
        self.records.append(self._record(loop, trained))
        self.paths.append(self._checkpoint.save(os.path.join(self.directory, "mark")))
        self._last = self.clock()
        self.off_clock += self._last - now
        if len(self.records) == len(self.seconds):
            loop.finish(None)

    def _record(self, loop, trained):
        trainer = self.trainer
        facts = (
            trainer.reporter.progress_record()
        )  # tokens_per_update, tokens_seen, ...
        record = {
            "mark_seconds": self.seconds[len(self.records)],
            "train_seconds": round(trained, 2),
            # Since the loop began, all included: CPU over wall time tells whether
            # the core was the run's own.
            "wall_seconds": round(time.perf_counter() - self._wall_started, 2),
            "cpu_seconds": round(time.process_time() - self._cpu_started, 2),
            "micro_steps": loop.done,
            "updates": trainer.step.update_step,
            "tokens_seen": facts["tokens_seen"],
            "tokens_per_update": facts["tokens_per_update"],
            "learning_rate": _learning_rate(trainer),
        }
        if "noise_scale" in facts:
            record["noise_scale"] = round(float(facts["noise_scale"]), 1)
        return record


def _learning_rate(trainer):
    """The rate of the next update, as the train step reads it; None if this
    optimizer's rate cannot be read as a number."""
    try:
        return float(tf.convert_to_tensor(trainer.optimizer.learning_rate))
    except (TypeError, ValueError, tf.errors.OpError):
        return None


def trainer_options(spec, output_dir):
    return TrainerOptions(
        problem=spec["problem"],
        data_dir=spec["data_dir"],
        output_dir=output_dir,
        train_steps=NEVER,
        eval_steps=0,
        local_eval_frequency=0,
        save_checkpoints_steps=NEVER,
        keep_checkpoint_max=2,
        log_steps=spec["log_steps"],
        random_seed=spec["seed"],
        eval_bleu_sentences=spec["bleu_sentences"],
        eval_decode_hparams=spec["decode_hparams"],
    )


def train(spec):
    """(trainer, marks hook) after training for spec["mark_seconds"][-1] seconds."""
    hp = build_hparams(spec["hparams_set"], spec["common_hparams"], spec["hparams"])
    marks_dir = os.path.join(spec["dir"], "marks")
    os.makedirs(marks_dir, exist_ok=True)
    options = trainer_options(spec, os.path.join(spec["dir"], "run"))
    trainer = Trainer(options, hp)
    clock = spec.get("clock", "wall")
    marks = ClockMarks(trainer, spec["mark_seconds"], marks_dir, clock)
    trainer.hooks.append(marks)
    trainer.train()
    if len(marks.records) != len(spec["mark_seconds"]):
        raise RuntimeError(
            f"training stopped after {len(marks.records)} of "
            f"{len(spec['mark_seconds'])} marks ({trainer.stopped_by or 'no reason'})"
        )
    return trainer, marks


def evaluate(trainer, marks, spec):
    """Adds dev loss, accuracy and BLEU to every mark's record (weights restored
    from its file), and beam BLEU to the last one. Returns what they were measured
    on: {"dev_tokens": target tokens of the loss, "bleu_sentences": n}."""
    dev = trainer.dataset(trainer.eval_split, training=False)
    final_bleu, measured_on = None, {}
    if spec["final_decode_hparams"] and trainer.bleu_evaluator:
        final_bleu = BleuEvaluator(
            trainer.model,
            trainer.problem,
            decode_hparams(spec["final_decode_hparams"], flag="final_decode_hparams"),
            spec["bleu_sentences"],
            max_input_length=trainer.hp.max_length or trainer.hp.batch_size,
        )
    for index, (record, path) in enumerate(zip(marks.records, marks.paths)):
        started = time.perf_counter()
        restore_model(trainer.model, path, marks.directory)
        metrics = trainer.evaluator.evaluate(dev, 0)
        record["dev_loss"] = round(metrics["loss"], 5)
        record["dev_accuracy"] = round(metrics["accuracy"], 5)
        measured_on["dev_tokens"] = metrics["eval_tokens"]
        if trainer.bleu_evaluator:
            bleu = trainer.bleu_evaluator.evaluate()
            record["bleu"] = round(bleu["bleu"], 2)
            measured_on["bleu_sentences"] = bleu["bleu_sentences"]
        if final_bleu and index == len(marks.records) - 1:
            record["bleu_final_decode"] = round(final_bleu.evaluate()["bleu"], 2)
        record["eval_seconds"] = round(time.perf_counter() - started, 2)
        if not spec["keep_checkpoints"]:
            for name in tf.io.gfile.glob(path + ".*"):
                os.remove(name)
    return measured_on


def run(spec):
    """The job's result: {"status": "ok", "marks": [...], ...} or, for any failure,
    {"status": "error", "error": its first line}."""
    result = {key: spec[key] for key in ("recipe", "hparams", "seed", "core", "filler")}
    try:
        trainer, marks = train(spec)
        measured_on = evaluate(trainer, marks, spec)
    except Exception as e:  # noqa: BLE001  (the table shows it; the others go on)
        result.update(status="error", error=f"{type(e).__name__}: {first_line(e)}")
        return result
    result.update(
        status="ok",
        marks=marks.records,
        off_clock_seconds=round(marks.off_clock, 2),
        **measured_on,
    )
    return result


# --- the parent's side: data, and a group of pinned children -------------------------


def cpu_has_bfloat16():
    """Whether /proc/cpuinfo lists bfloat16 units (AVX512-BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return any(flag in flags for flag in ("avx512_bf16", "amx_bf16"))


def prepare_data(args):
    """(problem, data_dir): --data_dir as given, or made once by t2t-datagen under
    --work_dir (for parallel text, in a directory named after the files' paths,
    sizes and --vocab_size)."""
    if args.data_dir:
        text = "translate_parallel_text" if args.train_source else args.problem
        return text, args.data_dir
    flags = []
    if args.train_source:
        problem = "translate_parallel_text"
        for name in ("train_source", "train_target", "dev_source", "dev_target"):
            if getattr(args, name):
                flags.append(f"--{name}={os.path.abspath(getattr(args, name))}")
        flags.append(f"--vocab_size={args.vocab_size}")
        key = "".join(f"{f}:{os.path.getsize(f.split('=', 1)[1])}" for f in flags[:-1])
        tag = hashlib.sha1((key + flags[-1]).encode()).hexdigest()[:10]
        data_dir = os.path.join(args.work_dir, f"data-{problem}-{tag}")
    else:
        problem = args.problem
        data_dir = os.path.join(args.work_dir, f"data-{problem}")
    if not os.path.exists(os.path.join(data_dir, f"{problem}.manifest.json")):
        harness.run_t2t(
            "datagen",
            f"--problem={problem}",
            f"--data_dir={os.path.abspath(data_dir)}",
            *flags,
        )
    return problem, data_dir


def run_group(specs, script):
    """Runs one child per spec (`script --child=SPEC`), all at once, each pinned to
    its spec["core"]; prints a line per child as it ends; returns their results in
    spec order."""
    started = time.time()
    for spec in specs:
        filler = " (filler)" if spec["filler"] else ""
        print(
            f"  {spec['recipe']} seed {spec['seed']}{filler} on core {spec['core']}",
            flush=True,
        )
    processes = [start(spec, script) for spec in specs]
    results = []
    for spec, process in zip(specs, processes):
        result = finish(spec, process)
        status = result["status"]
        if status != "ok":
            status += f": {result['error']}"
        print(f"  {spec['recipe']} seed {spec['seed']}: {status}", flush=True)
        results.append(result)
    print(f"  the group took {(time.time() - started) / 60:.1f} min", flush=True)
    return results


def start(spec, script):
    """The child process of one job, pinned to its core, its output in child.log."""
    if os.path.isdir(spec["dir"]):
        shutil.rmtree(spec["dir"])  # an old run would resume instead of training
    os.makedirs(spec["dir"])
    path = os.path.join(spec["dir"], "spec.json")
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)
    command = ["taskset", "-c", str(spec["core"]), sys.executable, script]
    command.append(f"--child={path}")
    with open(os.path.join(spec["dir"], "child.log"), "w") as log:  # the child's copy
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def finish(spec, process):
    """The child's result, or an error result quoting the end of its log."""
    code = process.wait()
    path = os.path.join(spec["dir"], "result.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    with open(os.path.join(spec["dir"], "child.log")) as f:
        tail = [line.strip() for line in f if line.strip()][-1:] or ["(no output)"]
    error = f"child exited with {code}: {tail[0][:300]}"
    return failed(spec["recipe"], spec["hparams"], error, spec["seed"], spec["core"])


def failed(recipe, hparams, error, seed=None, core=None):
    """The result of a run that did not train (as run() reports one)."""
    return {
        "recipe": recipe,
        "hparams": hparams,
        "seed": seed,
        "core": core,
        "filler": False,
        "status": "error",
        "error": error,
    }


def child_main(spec_path):
    """A child: runs the job of `spec_path` and writes its result.json beside it."""
    from absl import logging

    logging.set_verbosity(logging.INFO)  # the step lines, in child.log
    with open(spec_path) as spec_file:
        job = json.load(spec_file)
    with open(os.path.join(job["dir"], "result.json"), "w") as result_file:
        json.dump(run(job), result_file, indent=1)
