"""t2t-datagen: a text problem's raw data → SentencePiece vocabulary + TFRecord shards.

    t2t-datagen --problem=translate_parallel_text --data_dir=data/mine \\
      --train_source=train.de --train_target=train.en \\
      --dev_source=dev.de --dev_target=dev.en \\
      --test_source=test.de --test_target=test.en   # optional

Re-running with the same inputs does nothing; an interrupted run leaves no data that
reads as complete (the manifest is written last).
"""

from absl import flags, logging

from t2t_lite import registry
from t2t_lite.bin import common
from t2t_lite.data import datagen, datagen_report
from t2t_lite.data.text_problems import TextProblem
from t2t_lite.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "problem", "", "Registered text problem, e.g. translate_parallel_text."
)
flags.DEFINE_string("data_dir", "", "Where the vocabulary, shards and manifest go.")
flags.DEFINE_string(
    "tmp_dir", "", "Scratch space for unshuffled shards (default: --data_dir)."
)
# --- translate_parallel_text ---
flags.DEFINE_list(
    "train_source", [], "Training source file(s), one sentence per line (.gz ok)."
)
flags.DEFINE_list("train_target", [], "Training target file(s), line-aligned.")
flags.DEFINE_list("dev_source", [], "Dev source file(s); optional, see --dev_holdout.")
flags.DEFINE_list("dev_target", [], "Dev target file(s), line-aligned.")
flags.DEFINE_list(
    "test_source",
    [],
    "Test source file(s), optional (e.g. newstest2014); written like dev, for "
    "t2t-trainer/t2t-decoder --eval_use_test_set.",
)
flags.DEFINE_list("test_target", [], "Test target file(s), line-aligned.")
flags.DEFINE_integer(
    "dev_holdout",
    1000,
    "Without dev files: hold out this many random training pairs as dev "
    "(at most a tenth of them).",
)
# --- TFDS problems ---
flags.DEFINE_string(
    "tfds_data_dir", "", "TFDS data dir holding the prepared dataset (default: TFDS's)."
)
flags.DEFINE_string(
    "tfds_manual_dir", "", "Prepare the TFDS dataset from manual downloads here first."
)
# --- vocabulary and shards ---
flags.DEFINE_integer(
    "vocab_size", 0, "SentencePiece pieces per vocabulary; 0: the problem's default."
)
flags.DEFINE_boolean(
    "shared_vocab",
    True,
    "One vocabulary for source and target (what shared embeddings need); "
    "--noshared_vocab trains one per side.",
)
flags.DEFINE_integer(
    "vocab_sample_size", 1_000_000, "Sentences SentencePiece trains on, at most."
)
flags.DEFINE_float(
    "character_coverage", 1.0, "SentencePiece character coverage (0.9995 for CJK)."
)
flags.DEFINE_integer("num_shards", 10, "Training shards (dev always has one).")
flags.DEFINE_integer("max_examples", 0, "Keep only the first N training pairs; 0: all.")
flags.DEFINE_integer(
    "max_length", 0, "Drop pairs with a side longer than this many ids; 0: keep all."
)
flags.DEFINE_integer("random_seed", 1, "Seed of shard assignment, shuffling, holdout.")
flags.DEFINE_boolean(
    "overwrite", False, "Replace data generated earlier with other inputs or settings."
)
flags.DEFINE_integer("log_every", 100_000, "Progress line every this many pairs.")


def _problem():
    if not FLAGS.problem:
        raise UserError("--problem is required (e.g. translate_parallel_text).")
    problem_class = registry.PROBLEMS.get(FLAGS.problem)
    if not issubclass(problem_class, TextProblem):
        text = sorted(
            name
            for name in registry.PROBLEMS.names()
            if issubclass(registry.PROBLEMS.get(name), TextProblem)
        )
        raise UserError(
            f"problem {FLAGS.problem} is generated in-process by t2t-trainer and needs "
            f"no t2t-datagen; problems with data files: {', '.join(text)}."
        )
    return problem_class()


def _config():
    return datagen.DatagenConfig(
        vocab_size=FLAGS.vocab_size,
        shared_vocab=FLAGS.shared_vocab,
        vocab_sample_size=FLAGS.vocab_sample_size,
        character_coverage=FLAGS.character_coverage,
        num_shards=FLAGS.num_shards,
        max_examples=FLAGS.max_examples,
        max_length=FLAGS.max_length,
        train_source=tuple(FLAGS.train_source),
        train_target=tuple(FLAGS.train_target),
        dev_source=tuple(FLAGS.dev_source),
        dev_target=tuple(FLAGS.dev_target),
        test_source=tuple(FLAGS.test_source),
        test_target=tuple(FLAGS.test_target),
        dev_holdout=FLAGS.dev_holdout,
        tfds_data_dir=FLAGS.tfds_data_dir,
        tfds_manual_dir=FLAGS.tfds_manual_dir,
        seed=FLAGS.random_seed,
        overwrite=FLAGS.overwrite,
        log_every=FLAGS.log_every,
    )


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}.")
    problem = _problem()
    if not FLAGS.data_dir:
        raise UserError("--data_dir is required.")
    logging.set_verbosity(logging.INFO)
    summary = datagen.generate(
        problem, FLAGS.data_dir, FLAGS.tmp_dir or None, _config(), log=logging.info
    )
    print("\n".join(datagen_report.summary_lines(summary, FLAGS.data_dir)))
    return 0


def run():
    common.run_main(main, "t2t-datagen")


if __name__ == "__main__":
    run()
