"""t2t-exporter: a SavedModel that translates as t2t-decoder does, loaded in a fresh
process with TensorFlow (and tensorflow_text, for the SentencePiece ops) only; and
its bad-input table (one line "t2t-exporter: error: ...", no traceback)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from support.cli_helpers import assert_user_error, run_cli

from t2t_lite import registry
from t2t_lite.decoding.bleu import read_lines
from t2t_lite.decoding.decoder import Decoder, decode_hparams

pytestmark = pytest.mark.slow

# Greedy in batches of 3; beam 2 in batches of 4 with inputs cut to 6 tokens: the
# export must reproduce the decoder's batching, truncation and empty lines.
# translate_with_alpha(alpha=1.5) must give what the decoder gives with alpha=1.5.
SETTINGS = {
    "greedy": "beam_size=1,alpha=0.6,batch_size=3",
    "beam2": "beam_size=2,alpha=0.6,batch_size=4,max_input_length=6",
}
OTHER_ALPHA = 1.5

# Runs in a fresh interpreter: no t2t_lite, only what a serving process has.
_LOAD_AND_TRANSLATE = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    request = json.load(open(sys.argv[1]))
    answer = {}
    for name, export_dir in request["exports"].items():
        loaded = tf.saved_model.load(export_dir)
        sentences = tf.constant(request["lines"], tf.string)
        text = loaded.signatures["serving_default"](sentences=sentences)
        other = loaded.signatures["translate_with_alpha"](
            sentences=sentences, alpha=tf.constant(request["alpha"])
        )
        ids = loaded.signatures["translate_ids"](
            inputs=tf.constant(request["ids"], tf.int32)
        )
        answer[name] = {
            "translations": [t.decode("utf-8") for t in text["translations"].numpy()],
            "scores": text["scores"].numpy().tolist(),
            "with_alpha": [t.decode("utf-8") for t in other["translations"].numpy()],
            "with_alpha_scores": other["scores"].numpy().tolist(),
            "ids": ids["outputs"].numpy().tolist(),
            "loaded_t2t_lite": any(m.startswith("t2t_lite") for m in sys.modules),
        }
    print(json.dumps(answer))
    """
)


@pytest.fixture(scope="module")
def source_lines(numbers_run, tmp_path_factory):
    """11 dev sentences with an empty, a blank and an over-long line among them."""
    sources = read_lines(
        os.path.join(numbers_run.data_dir, "translate_numbers_en_fr-dev.source.txt")
    )[:11]
    lines = sources[:4] + [""] + sources[4:8] + ["   ", " ".join(sources[:3])]
    lines += sources[8:]
    path = tmp_path_factory.mktemp("export") / "source.en"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path, lines


def _padded(rows):
    width = max(len(r) for r in rows)
    return [r + [0] * (width - len(r)) for r in rows]


def test_export_translates_as_the_decoder_does(numbers_run, source_lines, tmp_path):
    source, lines = source_lines
    run, data = (
        f"--output_dir={numbers_run.output_dir}",
        f"--data_dir={numbers_run.data_dir}",
    )
    exports, decoded = {}, {}  # export and decode the same lines, same settings
    for name, settings in SETTINGS.items():
        exports[name] = str(tmp_path / name)
        result = run_cli(
            "exporter",
            run,
            data,
            f"--export_dir={exports[name]}",
            f"--decode_hparams={settings}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "signature serving_default: sentences string [None] ->" in result.stdout
    other = SETTINGS["beam2"].replace("alpha=0.6", f"alpha={OTHER_ALPHA}")
    runs = {**SETTINGS, "beam2_alpha": other}
    for name, settings in runs.items():
        result = run_cli(
            "decoder",
            run,
            data,
            f"--decode_hparams={settings}",
            f"--decode_from_file={source}",
            f"--decode_to_file={tmp_path / (name + '.fr')}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        decoded[name] = read_lines(str(tmp_path / (name + ".fr")))
    info = json.loads(
        (tmp_path / "beam2" / "assets.extra" / "t2t_export.json").read_text()
    )
    assert info["decode_hparams"]["beam_size"] == 2
    assert (
        tmp_path / "beam2" / "assets.extra" / "translate_numbers_en_fr.vocab.model"
    ).exists()

    # The ids signature gets the ids the problem encodes; its outputs are the ids of
    # the decoder's translations.
    problem = registry.PROBLEMS.get("translate_numbers_en_fr")()
    problem.load(numbers_run.data_dir)
    sources = [problem.encode_inputs(line) for line in lines if line.strip()]

    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "exports": exports,
                "lines": lines,
                "ids": _padded(sources),
                "alpha": OTHER_ALPHA,
            }
        )
    )
    process = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_TRANSLATE, str(request)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    answer = json.loads(process.stdout.splitlines()[-1])
    for name in SETTINGS:
        got = answer[name]
        assert not got["loaded_t2t_lite"]
        assert got["translations"] == decoded[name], name
        assert got["translations"][4] == got["translations"][9] == ""
        nonblank = [t for t, line in zip(decoded[name], lines) if line.strip()]
        assert [problem.decode(row) for row in got["ids"]] == nonblank
        assert got["with_alpha_scores"] != got["scores"]  # the input is used
    assert answer["beam2"]["with_alpha"] == decoded["beam2_alpha"]


def test_bad_inputs_are_one_line_errors(numbers_run, tmp_path):
    run, data = (
        f"--output_dir={numbers_run.output_dir}",
        f"--data_dir={numbers_run.data_dir}",
    )
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    (tmp_path / "no_checkpoint").mkdir()
    for name in ("hparams.json", "run.json"):  # a run that never saved
        shutil.copy(
            os.path.join(numbers_run.output_dir, name), tmp_path / "no_checkpoint"
        )
    out = f"--export_dir={tmp_path / 'out'}"
    rows = [
        (
            [f"--output_dir={tmp_path / 'missing'}", data, out],
            ["missing", "does not exist"],
        ),
        ([f"--output_dir={tmp_path / 'no_checkpoint'}", data, out], ["no checkpoint"]),
        ([run, data, f"--export_dir={tmp_path / 'full'}"], ["not empty", "overwrite"]),
        ([run, data, out, "--decode_hparams=return_beams=true"], ["return_beams"]),
        ([run, data, out, "--decode_hparams=beam_size=0"], ["beam_size", ">= 1"]),
        ([run, data, out, "--decode_hparams=beam_size=5000"], ["too large"]),
        ([run, f"--data_dir={tmp_path / 'nodata'}", out], ["nodata"]),
    ]
    for args, words in rows:
        assert_user_error(run_cli("exporter", *args), "t2t-exporter", *words)
    assert (tmp_path / "full" / "x").read_text() == "keep me"  # nothing lost
    assert not (tmp_path / "out").exists()


def test_a_problem_without_sentencepiece_exports_ids_in_ids_out(tmp_path):
    """Untrained weights are enough to compare with the library's Decoder: many
    inputs (several batches), empty ones, over-long ones."""
    import tensorflow as tf

    from t2t_lite.decoding.export import Translator, save_export, sentencepiece_vocabs
    from t2t_lite.models.factory import build_model

    problem = registry.PROBLEMS.get("algorithmic_reverse")()
    assert sentencepiece_vocabs(problem) is None
    hp = registry.HPARAMS_SETS.get("transformer_test")()
    tf.keras.utils.set_random_seed(3)
    model = build_model(registry.MODELS.get("transformer"), hp, problem.vocab_size)
    dhp = decode_hparams("beam_size=1,alpha=0.6,batch_size=3,extra_length=4")
    translator = Translator(model, dhp, max_input_length=6, vocabs=None)
    specs = save_export(translator, str(tmp_path / "export"), {"test": True})
    assert sorted(specs) == ["serving_default", "translate_ids"]
    sources = [[2, 3, 4, 1], [1], [5, 6, 7, 8, 9, 10, 11, 12, 1], [3, 1], [4, 4, 1]]
    sources += [[7, 6, 5, 4, 3, 1], [9, 1], [1], [2, 2, 2, 2, 2, 2, 2, 1]]
    expected = Decoder(model, dhp, 6).decode_ids(sources)
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    for name in ("serving_default", "translate_ids"):
        got = loaded.signatures[name](inputs=tf.constant(_padded(sources)))
        outputs = got["outputs"].numpy().tolist()
        assert [[i for i in row if i] for row in outputs] == [
            h[0].ids for h in expected
        ]
        scores = got["scores"].numpy().tolist()
        assert scores == pytest.approx([h[0].score for h in expected], abs=1e-5)


def test_separate_vocabularies_tokenize_and_detokenize_in_the_graph(tmp_path):
    """A problem with one SentencePiece model per side, untrained weights: the
    export's text equals the library's Decoder.translate (in this process)."""
    import tensorflow as tf

    from t2t_lite.data import datagen
    from t2t_lite.data.numbers_problem import TranslateNumbersEnFr
    from t2t_lite.decoding.export import Translator, save_export, sentencepiece_vocabs
    from t2t_lite.models.factory import build_model

    data_dir = str(tmp_path / "data")
    datagen.generate(
        TranslateNumbersEnFr(train_size=300, dev_size=20),
        data_dir,
        config=datagen.DatagenConfig(num_shards=1, vocab_size=60, shared_vocab=False),
        log=lambda _: None,
    )
    problem = registry.PROBLEMS.get("translate_numbers_en_fr")()
    problem.load(data_dir)
    vocabs = sentencepiece_vocabs(problem)
    assert vocabs[0].path != vocabs[1].path
    hp = registry.HPARAMS_SETS.get("transformer_test")()
    tf.keras.utils.set_random_seed(5)
    model = build_model(registry.MODELS.get("transformer"), hp, problem.vocab_size)
    dhp = decode_hparams("beam_size=2,batch_size=2,extra_length=3")
    save_export(Translator(model, dhp, 8, vocabs), str(tmp_path / "e"), {}, vocabs)
    assert len(os.listdir(tmp_path / "e" / "assets.extra")) == 3  # 2 vocabs + info
    lines = ["one hundred", "", "seventy-seven thousand two", "nine", "   "]
    expected = Decoder(model, dhp, 8).translate(
        lines, problem.encode_inputs, problem.decode
    )
    loaded = tf.saved_model.load(str(tmp_path / "e"))
    got = loaded.signatures["serving_default"](sentences=tf.constant(lines))
    translations = [t.decode("utf-8") for t in got["translations"].numpy()]
    assert translations == [hyps[0][0] for hyps in expected]
