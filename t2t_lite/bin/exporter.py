"""t2t-exporter: write a trained run as a SavedModel that translates text, or as a
CTranslate2 model directory.

    t2t-exporter --output_dir=RUN --data_dir=DATA [--export_dir=DIR]
        [--checkpoint_path=RUN/model-N] [--decode_hparams="beam_size=4,alpha=0.6"]
    t2t-exporter --format=ctranslate2 --output_dir=RUN --data_dir=DATA
        [--export_dir=DIR] [--quantization=int8]

The SavedModel's `serving_default` signature takes a 1-D string tensor of sentences
and returns {"translations", "scores"}, tokenizing with the problem's SentencePiece
model inside the graph; `translate_with_alpha` also takes the length penalty's alpha;
`translate_ids` takes and returns ids. Beam size, alpha and the other decode hparams
are baked in (see decoding/export.py).
"""

import os
import sys
import time

from absl import flags, logging

from t2t_lite.bin import common
from t2t_lite.bin.run_selection import define_run_selection_flags, run_selection
from t2t_lite.decoding import ctranslate2_export
from t2t_lite.decoding.decoder import decode_hparams
from t2t_lite.decoding.export import (
    ALPHA_SIGNATURE,
    IDS_SIGNATURE,
    TEXT_SIGNATURE,
    Translator,
    check_export_dir,
    default_export_dir,
    save_export,
    sentencepiece_vocabs,
)
from t2t_lite.decoding.loading import load_for_decoding
from t2t_lite.errors import UserError

FLAGS = flags.FLAGS
define_run_selection_flags(__name__, "export")
flags.DEFINE_string(
    "decode_hparams",
    "",
    "Baked into the export: e.g. 'beam_size=4,alpha=0.6,batch_size=32,"
    "extra_length=50,max_input_length=0' (as t2t-decoder's).",
)
flags.DEFINE_string(
    "export_dir", "", "Where to write the SavedModel; default: RUN/export/<step>."
)
flags.DEFINE_boolean(
    "overwrite", False, "Replace export_dir if it already holds something."
)

flags.DEFINE_boolean(
    "ids_only",
    False,
    "Export ids in, ids out only (no SentencePiece ops in the graph: loads without "
    "tensorflow_text, e.g. in a stock TensorFlow Serving); tokenize on the client "
    "with the vocabulary in the export's assets.extra/.",
)

flags.DEFINE_enum(
    "format",
    "savedmodel",
    ["savedmodel", "ctranslate2"],
    "savedmodel: a TensorFlow SavedModel (TF Serving); ctranslate2: a CTranslate2 "
    "model directory (pip install -e '.[ctranslate2]'), decoded by t2t-decoder "
    "--engine=ctranslate2 or CTranslate2's Translator.",
)
flags.DEFINE_string(
    "quantization",
    "",
    "With --format=ctranslate2: the weights' type as CTranslate2 names it (int8, "
    "int8_float32, int16, float16, bfloat16, ...); default: float32 as trained.",
)

_UNSUPPORTED = ("return_beams", "write_beam_scores")  # one translation per sentence


def _decode_hparams():
    dhp = decode_hparams(FLAGS.decode_hparams, flag="--decode_hparams")
    for key in _UNSUPPORTED:
        if getattr(dhp, key):
            raise UserError(
                f"--decode_hparams: {key} is not supported by t2t-exporter (an "
                "export returns the best translation of each sentence)."
            )
    return dhp


def _check_export_dir(export_dir):
    check_export_dir(
        export_dir, FLAGS.overwrite, flag="--export_dir", overwrite_flag="--overwrite"
    )


def _info(dhp, hp, checkpoint, problem, model_class, signatures):
    return {
        "checkpoint": os.path.abspath(checkpoint),
        "problem": problem.name,
        "model_class": model_class,
        "vocab_fingerprint": problem.vocab_fingerprint(),
        "decode_hparams": dhp.values(),
        "max_input_length": dhp.max_input_length or hp.max_length or hp.batch_size,
        "signatures": sorted(signatures),
        "text_signature": ALPHA_SIGNATURE in signatures,
        "load_needs_tensorflow_text": ALPHA_SIGNATURE in signatures,  # SentencePiece
    }


def _check_format_flags():
    """The flags that mean something for one format only, refused for the other."""
    if FLAGS.format == "savedmodel" and FLAGS.quantization:
        raise UserError("--quantization needs --format=ctranslate2.")
    if FLAGS.format == "ctranslate2":
        for name in ("ids_only", "decode_hparams"):
            if FLAGS[name].present:
                raise UserError(
                    f"--{name} is for --format=savedmodel: a CTranslate2 model "
                    "takes its decoding options per call (t2t-decoder "
                    "--engine=ctranslate2 --decode_hparams=...)."
                )
        ctranslate2_export.check_quantization(FLAGS.quantization)  # before loading


def _export_ctranslate2(model, problem, hp, path):
    export_dir = FLAGS.export_dir or ctranslate2_export.default_dir(
        os.path.dirname(path), path
    )
    _check_export_dir(export_dir)
    print(f"t2t-exporter: converting {path} to CTranslate2", file=sys.stderr)
    start = time.perf_counter()
    info = {
        "checkpoint": os.path.abspath(path),
        "problem": problem.name,
        "model_class": type(model).__name__,
        "vocab_fingerprint": problem.vocab_fingerprint(),
        "max_input_length": hp.max_length or hp.batch_size,
    }
    info = ctranslate2_export.convert(
        model, problem, export_dir, info, FLAGS.quantization or None, FLAGS.overwrite
    )
    print(
        f"t2t-exporter: wrote {export_dir} in {time.perf_counter() - start:.1f} s "
        f"(CTranslate2 {info['ctranslate2_version']}, {info['quantization']} "
        f"weights, positions up to {info['max_positions']})"
    )
    return 0


def main(argv):
    del argv
    _check_format_flags()
    dhp = _decode_hparams()
    if FLAGS.export_dir:  # refuse before the slow part
        _check_export_dir(FLAGS.export_dir)
    model, problem, hp, path = load_for_decoding(**run_selection(FLAGS))
    if FLAGS.format == "ctranslate2":
        return _export_ctranslate2(model, problem, hp, path)
    export_dir = FLAGS.export_dir or default_export_dir(os.path.dirname(path), path)
    _check_export_dir(export_dir)
    print(f"t2t-exporter: exporting {path}", file=sys.stderr)
    start = time.perf_counter()
    vocabs = None if FLAGS.ids_only else sentencepiece_vocabs(problem)
    if vocabs is None and not FLAGS.ids_only:
        logging.warning(
            "problem %s has no SentencePiece vocabulary: exporting ids in, ids out "
            "(%s is %s).",
            problem.name,
            TEXT_SIGNATURE,
            IDS_SIGNATURE,
        )
    max_input_length = hp.max_length or hp.batch_size  # as t2t-decoder
    translator = Translator(
        model, dhp, max_input_length, vocabs, flag="--decode_hparams"
    )
    names = [TEXT_SIGNATURE, IDS_SIGNATURE] + ([ALPHA_SIGNATURE] if vocabs else [])
    info = _info(dhp, hp, path, problem, type(model).__name__, names)
    logging.set_verbosity(logging.WARNING)  # not TF's lines on each function saved
    vocab_files = sentencepiece_vocabs(problem)  # for the client, with --ids_only
    specs = save_export(translator, export_dir, info, vocab_files, FLAGS.overwrite)
    for name, (inputs, outputs) in sorted(specs.items()):
        print(f"t2t-exporter: signature {name}: {_specs(inputs)} -> {_specs(outputs)}")
    print(
        f"t2t-exporter: wrote {export_dir} in {time.perf_counter() - start:.1f} s "
        f"(beam {dhp.beam_size}, alpha {dhp.alpha})"
    )
    return 0


def _specs(specs):
    """TensorSpecs (a dict, or a tuple of named ones) -> "name dtype [shape], ..."."""
    named = specs.items() if isinstance(specs, dict) else [(s.name, s) for s in specs]
    return ", ".join(
        f"{name} {spec.dtype.name} {spec.shape.as_list()}"
        for name, spec in sorted(named)
    )


def run():
    common.run_main(main, "t2t-exporter")


if __name__ == "__main__":
    run()
