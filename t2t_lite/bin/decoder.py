"""t2t-decoder: translate a file or stdin with a trained run (T2T's flag names),
through TensorFlow or through the run's CTranslate2 conversion (--engine)."""

import os
import sys
import time

import tensorflow as tf
from absl import flags, logging

from t2t_lite.bin import common
from t2t_lite.bin.run_selection import define_run_selection_flags, run_selection
from t2t_lite.data import text_io
from t2t_lite.decoding.bleu import corpus_scores
from t2t_lite.decoding.ctranslate2_engine import CTranslate2Decoder
from t2t_lite.decoding.decoder import Decoder, decode_hparams
from t2t_lite.decoding.loading import load_for_decoding, open_for_decoding
from t2t_lite.errors import UserError, first_line
from t2t_lite.fileio import write_atomically

FLAGS = flags.FLAGS
define_run_selection_flags(__name__, "decode with")
flags.DEFINE_string(
    "decode_hparams",
    "",
    "e.g. 'beam_size=4,alpha=0.6,batch_size=32,return_beams=false,extra_length=50'.",
)
flags.DEFINE_string(
    "decode_from_file",
    "",
    "Translate this file, one sentence a line. Default (and no --decode_interactive): "
    "the problem's dev set (test set with --eval_use_test_set), scored with BLEU.",
)
flags.DEFINE_string(
    "decode_to_file",
    "",
    "Write translations here (default: standard output; for the dev/test set: "
    "RUN/decode.dev.txt / RUN/decode.test.txt).",
)
flags.DEFINE_boolean(
    "eval_use_test_set",
    False,
    "Decode and score the problem's test split instead of dev (T2T's flag, as in "
    "t2t-trainer); writes RUN/decode.test.txt.",
)
flags.DEFINE_boolean(
    "decode_interactive", False, "Read sentences from stdin, print each translation."
)
flags.DEFINE_enum(
    "engine",
    "tensorflow",
    ["tensorflow", "ctranslate2"],
    "tensorflow: the run's checkpoint; ctranslate2: the model t2t-exporter "
    "--format=ctranslate2 converted from it (--ct2_dir), same inputs and outputs.",
)
flags.DEFINE_string(
    "ct2_dir", "", "With --engine=ctranslate2: the converted model directory."
)
flags.DEFINE_string(
    "ct2_device", "cpu", "With --engine=ctranslate2: cpu, cuda or auto."
)
flags.DEFINE_string(
    "ct2_compute_type",
    "default",
    "With --engine=ctranslate2: CTranslate2's compute_type (default: the weights' "
    "own; int8, float16, ... convert at load).",
)
flags.DEFINE_integer(
    "ct2_threads", 0, "With --engine=ctranslate2: threads per translation (0: auto)."
)
flags.DEFINE_float(
    "ct2_patience",
    2.0,
    "With --engine=ctranslate2: a sentence's beam search ends once beam_size × "
    "patience hypotheses have finished (2 finds the TensorFlow search's best "
    "hypotheses; 1 is CTranslate2's default, faster).",
)


def _format(hypotheses, hp):
    """One output line: the best translation, or all beams tab-separated."""
    if not hp.return_beams:
        return hypotheses[0][0]
    if hp.write_beam_scores:
        return "\t".join(f"{text}\t{score:.4f}" for text, score in hypotheses)
    return "\t".join(text for text, _ in hypotheses)


def _encoder(problem, where):
    def encode(item):
        number, text = item
        try:
            return problem.encode_inputs(text)
        except ValueError as e:
            raise UserError(f"{where}:{number}: {e}.") from None

    return encode


def _translate(decoder, problem, hp, lines, where):
    """(number, text) lines → output lines, logging progress on long inputs."""
    encode = _encoder(problem, where)
    sources = [encode(item) if item[1] else [1] for item in lines]
    last_report = [time.perf_counter()]

    def progress(done, total):  # a line every ~30 s on long files
        now = time.perf_counter()
        if now - last_report[0] > 30 and done < total:
            last_report[0] = now
            logging.info("decoded %d of %d lines", done, total)

    results = decoder.decode_ids(sources, progress=progress)
    if decoder.truncated:
        logging.warning(
            "%d input lines were longer than %d tokens and were truncated.",
            decoder.truncated,
            decoder.max_input_length,
        )
    return [
        _format([(problem.decode(h.ids), h.score) for h in hyps], hp)
        for hyps in results
    ]


def _write(outputs, path):
    """To `path` (atomically), or to standard output when path is empty."""
    text = "".join(f"{line}\n" for line in outputs)
    if not path:
        sys.stdout.write(text)
        return
    try:
        write_atomically(path, text)
    except OSError as e:
        raise UserError(f"--decode_to_file '{path}': {e.strerror}.") from None
    except tf.errors.OpError as e:  # tf.io.gfile's errors (a missing directory)
        raise UserError(f"--decode_to_file '{path}': {first_line(e)}") from None


def _report(count, seconds, hp, where):
    rate = count / seconds if seconds else 0.0
    print(
        f"t2t-decoder: {count} lines in {seconds:.1f} s ({rate:.1f} sentences/s, "
        f"beam {hp.beam_size}){f' → {where}' if where else ''}",
        file=sys.stderr,
    )


def _read_source():
    """--decode_from_file's (number, text) lines, read before the model is loaded so a
    missing or non-UTF-8 file fails at once (text_io checks it, once)."""
    try:
        return list(text_io.read_lines(FLAGS.decode_from_file))
    except UserError as e:
        raise UserError(f"--decode_from_file: {e}") from None


def _decode_file(decoder, problem, hp, lines):
    start = time.perf_counter()
    outputs = _translate(decoder, problem, hp, lines, FLAGS.decode_from_file)
    _write(outputs, FLAGS.decode_to_file)
    _report(len(lines), time.perf_counter() - start, hp, FLAGS.decode_to_file)


def _decode_split(decoder, problem, hp, run_dir, split="dev"):
    """T2T's default: decode the problem's dev (or test) set and score it with BLEU."""
    sources, references = (
        problem.dev_text() if split == "dev" else problem.split_text(split)
    )
    start = time.perf_counter()
    outputs = _translate(decoder, problem, hp, list(enumerate(sources, 1)), split)
    path = FLAGS.decode_to_file or os.path.join(run_dir, f"decode.{split}.txt")
    _write(outputs, path)
    _report(len(outputs), time.perf_counter() - start, hp, path)
    best = [line.split("\t")[0] for line in outputs]
    scores = corpus_scores(best, references)
    print(f"BLEU = {scores.bleu:.2f}  (signature {scores.bleu_signature})")
    print(f"chrF = {scores.chrf:.2f}  (signature {scores.chrf_signature})")


def _decode_interactive(decoder, problem, hp):
    prompt = sys.stdin.isatty()
    number = 0
    while True:
        if prompt:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        number += 1
        try:
            ids = problem.encode_inputs(line.strip()) if line.strip() else [1]
        except ValueError as e:  # interactive: report and keep going
            print(f"t2t-decoder: error: line {number}: {e}.", file=sys.stderr)
            continue
        truncated = decoder.truncated
        (hypotheses,) = decoder.decode_ids([ids])
        if decoder.truncated > truncated:
            print(
                f"t2t-decoder: warning: line {number} is longer than "
                f"{decoder.max_input_length} tokens; decoded its beginning only.",
                file=sys.stderr,
            )
        texts = [(problem.decode(h.ids), h.score) for h in hypotheses]
        print(_format(texts, hp), flush=True)


def _check_engine_flags():
    if FLAGS.engine == "ctranslate2" and not FLAGS.ct2_dir:
        raise UserError("--engine=ctranslate2 needs --ct2_dir (t2t-exporter's output).")
    if FLAGS.engine == "tensorflow" and FLAGS.ct2_dir:
        raise UserError("--ct2_dir needs --engine=ctranslate2.")


def _decoder(model, problem, dhp, hp, path):
    max_input_length = hp.max_length or hp.batch_size
    if FLAGS.engine == "tensorflow":
        print(f"t2t-decoder: decoding with {path}", file=sys.stderr)
        return Decoder(model, dhp, max_input_length, flag="--decode_hparams")
    decoder = CTranslate2Decoder(
        FLAGS.ct2_dir,
        dhp,
        max_input_length,
        problem,
        device=FLAGS.ct2_device,
        compute_type=FLAGS.ct2_compute_type,
        threads=FLAGS.ct2_threads,
        patience=FLAGS.ct2_patience,
    )
    print(
        f"t2t-decoder: decoding with CTranslate2 {FLAGS.ct2_dir} (converted from "
        f"{decoder.info['checkpoint']}, {decoder.info['quantization']} weights)",
        file=sys.stderr,
    )
    return decoder


def main(argv):
    del argv
    if FLAGS.decode_interactive and (FLAGS.decode_from_file or FLAGS.decode_to_file):
        raise UserError(
            "--decode_interactive reads stdin and prints to stdout; drop "
            "--decode_from_file/--decode_to_file (or --decode_interactive)."
        )
    if FLAGS.eval_use_test_set and (FLAGS.decode_from_file or FLAGS.decode_interactive):
        raise UserError(
            "--eval_use_test_set decodes the problem's test split; drop it, or "
            "--decode_from_file/--decode_interactive."
        )
    _check_engine_flags()
    lines = _read_source() if FLAGS.decode_from_file else None
    dhp = decode_hparams(FLAGS.decode_hparams, flag="--decode_hparams")
    logging.set_verbosity(logging.INFO)
    run = run_selection(FLAGS)
    if FLAGS.engine == "tensorflow":
        model, problem, hp, path = load_for_decoding(**run)
        run_dir = os.path.dirname(path)
    else:  # the converted model decodes: no TensorFlow model to build
        model, path = None, None
        _, problem, hp, run_dir, _ = open_for_decoding(**run)
    split = "test" if FLAGS.eval_use_test_set else "dev"
    if FLAGS.eval_use_test_set:
        problem.require_split(split)  # one line for data without a test split
    decoder = _decoder(model, problem, dhp, hp, path)
    if FLAGS.decode_from_file:
        _decode_file(decoder, problem, dhp, lines)
    elif FLAGS.decode_interactive:
        _decode_interactive(decoder, problem, dhp)
    else:
        _decode_split(decoder, problem, dhp, run_dir, split)
    return 0


def run():
    common.run_main(main, "t2t-decoder")


if __name__ == "__main__":
    run()
