"""t2t-trainer: train a registered model on a registered problem (T2T's flag names).

The console is quiet by default: TensorFlow's start-up lines (oneDNN, CUDA,
cpu_feature_guard) and its per-save "Sharding callback" lines are hidden; set the
environment variable T2T_LITE_TF_LOGS=1 to see them (t2t_lite/console.py).
"""

import os

from absl import flags, logging

from t2t_lite import registry
from t2t_lite.bin import common
from t2t_lite.decoding.decoder import decode_hparams
from t2t_lite.errors import UserError
from t2t_lite.fileio import write_atomically
from t2t_lite.hparams_checks import validate
from t2t_lite.runs.warm_start import resolve_checkpoint
from t2t_lite.training.distribution import make_strategy
from t2t_lite.training.trainer import RunConfig, Trainer

FLAGS = flags.FLAGS
FLAGS_FILE = "flags.txt"
flags.DEFINE_string("problem", "algorithmic_reverse", "Registered problem name.")
flags.DEFINE_string("model", "transformer", "Registered model name.")
flags.DEFINE_string("hparams_set", "transformer_base", "Registered hparams set.")
flags.DEFINE_string(
    "hparams", "", 'Overrides, e.g. "batch_size=2048,label_smoothing=0".'
)
flags.DEFINE_string(
    "data_dir", "", "Directory of the problem's data files, if it has any."
)
flags.DEFINE_string(
    "output_dir",
    "",
    "Where checkpoints, hparams.json, metrics.jsonl "
    "and TensorBoard logs go; a run resumes from here.",
)
flags.DEFINE_integer(
    "train_steps",
    250000,
    "Micro-steps (batches) to train; with n "
    "accumulation steps this is n × the number of updates.",
)
flags.DEFINE_integer("eval_steps", 100, "Dev batches per evaluation; <= 0: all.")
flags.DEFINE_integer(
    "local_eval_frequency", 1000, "Evaluate every this many steps; 0: only at the end."
)
flags.DEFINE_integer(
    "save_checkpoints_steps", 1000, "Checkpoint every this many steps."
)
flags.DEFINE_integer("keep_checkpoint_max", 20, "Checkpoints to keep.")
flags.DEFINE_integer(
    "log_steps",
    100,
    "Log a progress line (loss, lr, gradient norm, tokens/s, ETA) every this many "
    "steps. TensorFlow's own start-up and per-save log lines are hidden; set the "
    "environment variable T2T_LITE_TF_LOGS=1 to see them.",
)
flags.DEFINE_integer(
    "random_seed", 1, "Seed for initialization, dropout and shuffling."
)
flags.DEFINE_boolean(
    "deterministic",
    False,
    "Enable TensorFlow op determinism: two runs with the same flags give bitwise "
    "identical weights (slower; see README).",
)
flags.DEFINE_boolean(
    "xla",
    False,
    "Compile the forward and backward pass with XLA (jit_compile); training batches "
    "are padded to their length bucket so that XLA compiles once per bucket (seconds "
    "each). Measure before using it: on a CPU it was faster only for small models "
    "without dropout (see README, scripts/bench_xla.py).",
)
flags.DEFINE_integer(
    "eval_bleu_sentences",
    256,
    "Translation problems: dev sentences decoded for BLEU at every evaluation; "
    "0: no BLEU; < 0: the whole dev set.",
)
flags.DEFINE_string(
    "eval_decode_hparams",
    "beam_size=1",
    "Decode hparams of that BLEU (default greedy; see t2t-decoder --decode_hparams).",
)
flags.DEFINE_string(
    "warm_start_from",
    "",
    "A run directory (its newest checkpoint) or checkpoint whose MODEL WEIGHTS start "
    "this new run (fine-tuning); optimizer, counters and accumulators start fresh. "
    "Ignored when output_dir already has checkpoints (the run resumes).",
)
flags.DEFINE_boolean(
    "eval_use_test_set",
    False,
    "Evaluate (loss, accuracy, BLEU) on the problem's test split instead of dev "
    "(T2T's flag); its data needs one (t2t-datagen --test_source/--test_target).",
)
flags.DEFINE_integer(
    "eval_early_stopping_steps",
    0,
    "Stop when eval_early_stopping_metric has not improved for this many steps "
    "(T2T's flag; 0: never stop early). The run saves and exits 0.",
)
flags.DEFINE_enum(
    "eval_early_stopping_metric",
    "loss",
    ["loss", "accuracy", "sequence_accuracy", "bleu"],
    "The metric of early stopping and of the best checkpoint (OUTPUT_DIR/best/, "
    "never deleted by keep_checkpoint_max); bleu needs a translation problem.",
)
flags.DEFINE_boolean(
    "eval_early_stopping_metric_minimize",
    None,
    "Whether lower is better for that metric (default: True for loss, False for "
    "accuracy, sequence_accuracy and bleu).",
)
flags.DEFINE_float(
    "keep_checkpoint_every_n_hours",
    0.0,
    "Also keep one checkpoint per this many hours, beyond keep_checkpoint_max "
    "(T2T's flag; 0: off).",
)
flags.DEFINE_integer(
    "worker_gpu",
    1,
    "Replicas on this machine (MirroredStrategy over that many GPUs; without GPUs, "
    "the CPU is split into that many logical devices). Multi-host training is set "
    "by the TF_CONFIG environment variable (MultiWorkerMirroredStrategy).",
)
flags.DEFINE_boolean("registry_help", False, "List every registered name and exit.")


def _check_flags():
    if not FLAGS.output_dir:
        raise UserError("--output_dir is required.")
    for name in (
        "train_steps",
        "save_checkpoints_steps",
        "keep_checkpoint_max",
        "log_steps",
    ):
        if FLAGS[name].value <= 0:
            raise UserError(f"--{name} must be > 0, got {FLAGS[name].value}.")
    if not 0 <= FLAGS.random_seed < 2**32:
        raise UserError(
            f"--random_seed must be in [0, 2**32), got {FLAGS.random_seed}."
        )
    for name in ("eval_early_stopping_steps", "keep_checkpoint_every_n_hours"):
        if FLAGS[name].value < 0:
            raise UserError(f"--{name} must be >= 0, got {FLAGS[name].value}.")
    if FLAGS.worker_gpu < 1:
        raise UserError(f"--worker_gpu must be >= 1, got {FLAGS.worker_gpu}.")
    if FLAGS.local_eval_frequency < 0:
        raise UserError(
            f"--local_eval_frequency must be >= 0, got {FLAGS.local_eval_frequency}."
        )


def build_hparams(hparams_set, overrides, model="transformer"):
    """The named set with overrides applied (unknown names and keys: one-line errors),
    range-checked for `model` (a registered name)."""
    hp = registry.HPARAMS_SETS.get(hparams_set)()
    return validate(hp.parse(overrides), model)


def main(argv):
    del argv
    if FLAGS.registry_help:
        print(registry.help_text())
        return 0
    _check_flags()
    eval_decode_hp = decode_hparams(FLAGS.eval_decode_hparams, "--eval_decode_hparams")
    registry.PROBLEMS.get(FLAGS.problem)
    registry.MODELS.get(FLAGS.model)
    hp = build_hparams(FLAGS.hparams_set, FLAGS.hparams, FLAGS.model)
    if FLAGS.warm_start_from:
        resolve_checkpoint(FLAGS.warm_start_from)  # a bad path fails before any write
    logging.set_verbosity(logging.INFO)
    config = RunConfig(
        problem=FLAGS.problem,
        model=FLAGS.model,
        output_dir=FLAGS.output_dir,
        train_steps=FLAGS.train_steps,
        data_dir=FLAGS.data_dir,
        eval_steps=FLAGS.eval_steps,
        local_eval_frequency=FLAGS.local_eval_frequency,
        save_checkpoints_steps=FLAGS.save_checkpoints_steps,
        keep_checkpoint_max=FLAGS.keep_checkpoint_max,
        log_steps=FLAGS.log_steps,
        random_seed=FLAGS.random_seed,
        deterministic=FLAGS.deterministic,
        xla=FLAGS.xla,
        eval_bleu_sentences=FLAGS.eval_bleu_sentences,
        eval_decode_hparams=eval_decode_hp,
        warm_start_from=FLAGS.warm_start_from,
        eval_use_test_set=FLAGS.eval_use_test_set,
        eval_early_stopping_steps=FLAGS.eval_early_stopping_steps,
        eval_early_stopping_metric=FLAGS.eval_early_stopping_metric,
        eval_early_stopping_metric_minimize=FLAGS.eval_early_stopping_metric_minimize,
        keep_checkpoint_every_n_hours=FLAGS.keep_checkpoint_every_n_hours,
    )
    strategy = make_strategy(FLAGS.worker_gpu)
    trainer = Trainer(config, hp, strategy=strategy)
    if trainer.chief:
        _write_flags_file(FLAGS.output_dir)
    record = trainer.train()
    if trainer.stopped_by:
        print(
            f"t2t-trainer: stopped by {trainer.stopped_by} at step "
            f"{trainer.step.micro_step} (update {trainer.step.update_step}); newest "
            f"checkpoint: {trainer.checkpoints.latest}. Run the same command to resume."
        )
        return 0
    if "loss" not in record:  # a worker other than the chief: it does not evaluate
        print(
            f"t2t-trainer: worker done at step {record['global_step']} (update "
            f"{record['update_step']}); the chief evaluates and writes the run."
        )
        return 0
    print(
        f"Final eval at step {record['global_step']} (update "
        f"{record['update_step']}): loss {record['loss']:.4f}, accuracy "
        f"{record['accuracy']:.4f}, sequence_accuracy "
        f"{record['sequence_accuracy']:.4f}"
        + (f", BLEU {record['bleu']:.2f}" if "bleu" in record else "")
    )
    if trainer.early_stopped:
        print(
            f"t2t-trainer: stopped early at step {record['global_step']} (update "
            f"{record['update_step']}): {trainer.early_stopped}."
        )
    if trainer.best.describe():
        print(f"best checkpoint: {trainer.best.describe()}")
    return 0


def _write_flags_file(output_dir):
    """OUTPUT_DIR/flags.txt, next to hparams.json (T2T's flags.txt): the value of
    every t2t-trainer flag, defaults included, and of any other flag given on the
    command line (absl's, e.g. --verbosity), one "--name=value" per line, so that
    `t2t-trainer --flagfile=OUTPUT_DIR/flags.txt` repeats the command."""
    lines = []
    for module, module_flags in sorted(FLAGS.flags_by_module_dict().items()):
        ours = not module.startswith(("absl.", "tensorflow."))
        for flag in module_flags:
            if (ours or flag.present) and flag.value is not None:
                lines.append(flag.serialize())
    write_atomically(
        os.path.join(output_dir, FLAGS_FILE), "\n".join(sorted(set(lines))) + "\n"
    )


def run():
    common.run_main(main, "t2t-trainer")


if __name__ == "__main__":
    run()
