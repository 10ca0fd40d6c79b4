"""t2t-trainer: train a registered model on a registered problem (T2T's flag names).

The console is quiet by default: TensorFlow's start-up lines (oneDNN, CUDA,
cpu_feature_guard) and its per-save "Sharding callback" lines are hidden; set the
environment variable T2T_LITE_TF_LOGS=1 to see them (t2t_lite/console.py).
"""

import os

from absl import flags, logging

from t2t_lite import registry
from t2t_lite.bin import common
from t2t_lite.errors import UserError
from t2t_lite.fileio import write_atomically
from t2t_lite.hparams_checks import validate
from t2t_lite.outputs.warm_start import resolve_checkpoint
from t2t_lite.training.cluster import slurm
from t2t_lite.training.cluster.distribution import CLUSTER_SOURCES, make_strategy
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions, TrainerOptionsError
from t2t_lite.training.opening.trainer_options import flag_specs

FLAGS = flags.FLAGS
FLAGS_FILE = "flags.txt"
# The run options (TrainerOptions's fields: --problem, --output_dir, --train_steps, ...)
# are declared once, in training/opening/trainer_options.py; these flags are generated from them.
common.define_flags(flag_specs(), __name__)
flags.DEFINE_string("hparams_set", "transformer_base", "Registered hparams set.")
flags.DEFINE_string(
    "hparams", "", 'Overrides, e.g. "batch_size=2048,label_smoothing=0".'
)
flags.DEFINE_integer(
    "worker_gpu",
    1,
    "Replicas on this machine (MirroredStrategy over that many GPUs; without GPUs, "
    "the CPU is split into that many logical devices). Multi-host training: "
    "--cluster.",
)
flags.DEFINE_enum(
    "cluster",
    "auto",
    list(CLUSTER_SOURCES),
    "Which hosts train together (MultiWorkerMirroredStrategy): tf_config (the "
    "TF_CONFIG environment variable), slurm (the SLURM job step srun started this "
    "task in: one worker per task), none (this host alone) or auto (TF_CONFIG if "
    "set, else a SLURM step of more than one task, else this host alone).",
)
flags.DEFINE_integer(
    "cluster_port",
    slurm.DEFAULT_PORT,
    "SLURM clusters: the port of a node's first task; its k-th task listens on "
    "cluster_port + k (as TensorFlow's SlurmClusterResolver).",
)
flags.DEFINE_float(
    "lost_worker_timeout",
    30,
    "Multi-host runs: seconds without a heartbeat after which a worker counts as "
    "lost and the others stop with a message saying so (TensorFlow's coordination "
    "service).",
)
flags.DEFINE_boolean("registry_help", False, "List every registered name and exit.")


def _trainer_options():
    """TrainerOptions from the flags; its range checks (the library's) name the flag."""
    try:
        return TrainerOptions(
            **{spec.name: FLAGS[spec.name].value for spec in flag_specs()}
        )
    except TrainerOptionsError as e:
        raise UserError(f"--{e.field} {e.requirement}") from None


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
    if FLAGS.worker_gpu < 1:
        raise UserError(f"--worker_gpu must be >= 1, got {FLAGS.worker_gpu}.")
    config = _trainer_options()
    registry.PROBLEMS.get(config.problem)
    registry.MODELS.get(config.model)
    hp = build_hparams(FLAGS.hparams_set, FLAGS.hparams, config.model)
    if config.warm_start_from:
        resolve_checkpoint(config.warm_start_from)  # a bad path fails before any write
    logging.set_verbosity(logging.INFO)
    strategy = make_strategy(
        FLAGS.worker_gpu,
        lost_worker_timeout=FLAGS.lost_worker_timeout,
        cluster_source=FLAGS.cluster,
        cluster_port=FLAGS.cluster_port,
    )
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
