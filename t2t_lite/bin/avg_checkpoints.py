"""t2t-avg-all: average a run's last checkpoints into a new directory (T2T's flags).

    t2t-avg-all --model_dir=runs/ende --output_dir=runs/ende_avg --n=5
    t2t-decoder --output_dir=runs/ende_avg ...

The output directory gets model-N (N = the newest averaged step), a `checkpoint` state
file, and the run's hparams.json and run.json, so it decodes like the run itself.
"""

from absl import flags, logging

from t2t_lite.bin import common
from t2t_lite.errors import UserError
from t2t_lite.outputs import averaging

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "", "The run's --output_dir, holding model-N files.")
flags.DEFINE_string(
    "output_dir", "", "Where the averaged checkpoint goes; not --model_dir."
)
flags.DEFINE_integer("n", 5, "Average the newest n checkpoints.")
flags.DEFINE_boolean(
    "overwrite", False, "Replace a checkpoint already in --output_dir."
)


def main(argv):
    del argv
    for name in ("model_dir", "output_dir"):
        if not FLAGS[name].value:
            raise UserError(f"--{name} is required.")
    logging.set_verbosity(logging.INFO)
    # averaging.average_checkpoints, in steps to report the steps: the library
    # checks the directories and --n, each once, before anything is read or written.
    averaging.check_output_dir(FLAGS.model_dir, FLAGS.output_dir, FLAGS.overwrite)
    checkpoints = averaging.newest_checkpoints(FLAGS.model_dir, FLAGS.n)
    path = averaging.write_average(checkpoints, FLAGS.model_dir, FLAGS.output_dir)
    steps = ", ".join(str(step) for step, _ in checkpoints)
    print(
        f"t2t-avg-all: averaged {len(checkpoints)} checkpoint(s) of "
        f"{FLAGS.model_dir} (steps {steps}) into {path}"
    )
    return 0


def run():
    common.run_main(main, "t2t-avg-all")


if __name__ == "__main__":
    run()
