"""t2t-bleu: corpus BLEU and chrF of a translation file against a reference file.

    t2t-bleu --translation=newstest2014.decoded.en --reference=newstest2014.en

Prints BLEU and chrF with their sacrebleu signatures, which say how they were computed
(quote those with the numbers).
"""

from absl import flags

from t2t_lite.bin import common
from t2t_lite.decoding import bleu
from t2t_lite.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_string("translation", "", "The system output, one sentence per line.")
flags.DEFINE_string("reference", "", "The reference translation, line-aligned.")
flags.DEFINE_enum(
    "tokenize",
    "13a",
    bleu.TOKENIZERS,
    "sacrebleu's BLEU tokenizer; 13a is the WMT standard (zh for Chinese, "
    "ja-mecab for Japanese, intl for Unicode punctuation).",
)
flags.DEFINE_boolean("lowercase", False, "Case-insensitive BLEU and chrF.")


def _read(flag):
    path = FLAGS[flag].value
    if not path:
        raise UserError(f"--{flag} is required.")
    try:
        return bleu.read_lines(path)
    except UserError as e:
        raise UserError(f"--{flag}: {e}") from None


def main(argv):
    del argv
    translation, reference = _read("translation"), _read("reference")
    if len(translation) != len(reference):
        raise UserError(
            f"--translation '{FLAGS.translation}' has {len(translation)} lines but "
            f"--reference '{FLAGS.reference}' has {len(reference)}; they must be "
            "line-aligned."
        )
    scores = bleu.corpus_scores(
        translation, reference, tokenize=FLAGS.tokenize, lowercase=FLAGS.lowercase
    )
    print(f"BLEU = {scores.bleu:.2f}  (signature {scores.bleu_signature})")
    print(f"chrF = {scores.chrf:.2f}  (signature {scores.chrf_signature})")
    return 0


def run():
    common.run_main(main, "t2t-bleu")


if __name__ == "__main__":
    run()
