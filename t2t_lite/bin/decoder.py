"""t2t-decoder: translate a file or stdin with a trained run (T2T's flag names)."""

import os
import sys
import time

from absl import flags, logging

from t2t_lite.bin import common
from t2t_lite.data import text_io
from t2t_lite.decoding.decoder import Decoder, decode_hparams
from t2t_lite.decoding.loading import load_for_decoding
from t2t_lite.errors import UserError
from t2t_lite.training.run_dir import write_atomically

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", "", "The run to decode with (its checkpoints).")
flags.DEFINE_string(
    "checkpoint_path", "", "A checkpoint prefix (RUN/model-N); default: the newest."
)
flags.DEFINE_string("problem", "", "Problem; default: the run's (run.json).")
flags.DEFINE_string("model", "", "Model; default: the run's (run.json).")
flags.DEFINE_string("hparams_set", "", "Default: the run's hparams.json.")
flags.DEFINE_string("hparams", "", "Must agree with the run's hparams.json.")
flags.DEFINE_string("data_dir", "", "The problem's data dir (its vocabulary).")
flags.DEFINE_string(
    "decode_hparams",
    "",
    "e.g. 'beam_size=4,alpha=0.6,batch_size=32,return_beams=false,extra_length=50'.",
)
flags.DEFINE_string("decode_from_file", "", "Translate this file, one sentence a line.")
flags.DEFINE_string(
    "decode_to_file", "", "Write translations here (default: standard output)."
)
flags.DEFINE_boolean(
    "decode_interactive", False, "Read sentences from stdin, print each translation."
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


def _decode_file(decoder, problem, hp):
    path = FLAGS.decode_from_file
    lines = list(text_io.read_lines(path))  # (number, text); one-line errors
    start = time.perf_counter()
    encode = _encoder(problem, path)
    sources = [encode(item) if item[1] else [1] for item in lines]
    last_report = [start]

    def progress(done, total):  # a line every ~30 s on long files
        now = time.perf_counter()
        if now - last_report[0] > 30 and done < total:
            last_report[0] = now
            logging.info("decoded %d of %d lines", done, total)

    results = decoder.decode_ids(sources, progress=progress)
    outputs = [
        _format([(problem.decode(h.ids), h.score) for h in hyps], hp)
        for hyps in results
    ]
    seconds = time.perf_counter() - start
    text = "".join(f"{line}\n" for line in outputs)
    if FLAGS.decode_to_file:
        try:
            write_atomically(FLAGS.decode_to_file, text)
        except OSError as e:
            raise UserError(
                f"--decode_to_file '{FLAGS.decode_to_file}': {e.strerror}."
            ) from None
    else:
        sys.stdout.write(text)
    if decoder.truncated:
        logging.warning(
            "%d input lines were longer than %d tokens and were truncated.",
            decoder.truncated,
            decoder.max_input_length,
        )
    rate = len(lines) / seconds if seconds else 0.0
    where = f" → {FLAGS.decode_to_file}" if FLAGS.decode_to_file else ""
    print(
        f"t2t-decoder: {len(lines)} lines in {seconds:.1f} s ({rate:.1f} sentences/s, "
        f"beam {hp.beam_size}){where}",
        file=sys.stderr,
    )


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


def main(argv):
    del argv
    if not FLAGS.decode_from_file and not FLAGS.decode_interactive:
        raise UserError("give --decode_from_file=FILE or --decode_interactive.")
    if FLAGS.decode_interactive and (FLAGS.decode_from_file or FLAGS.decode_to_file):
        raise UserError(
            "--decode_interactive reads stdin and prints to stdout; drop "
            "--decode_from_file/--decode_to_file (or --decode_interactive)."
        )
    if FLAGS.decode_from_file and not os.path.exists(FLAGS.decode_from_file):
        raise UserError(f"--decode_from_file '{FLAGS.decode_from_file}': no such file.")
    dhp = decode_hparams(FLAGS.decode_hparams)
    logging.set_verbosity(logging.INFO)
    model, problem, hp, path = load_for_decoding(
        output_dir=FLAGS.output_dir,
        checkpoint_path=FLAGS.checkpoint_path,
        problem=FLAGS.problem,
        model=FLAGS.model,
        hparams_set=FLAGS.hparams_set,
        hparams=FLAGS.hparams,
        data_dir=FLAGS.data_dir,
    )
    print(f"t2t-decoder: decoding with {path}", file=sys.stderr)
    decoder = Decoder(model, dhp, max_input_length=hp.max_length or hp.batch_size)
    if FLAGS.decode_from_file:
        _decode_file(decoder, problem, dhp)
    else:
        _decode_interactive(decoder, problem, dhp)
    return 0


def run():
    common.run_main(main, "t2t-decoder")


if __name__ == "__main__":
    run()
