"""t2t-exporter --format=ctranslate2 and t2t-decoder --engine=ctranslate2: the
converted model translates as the TensorFlow decoder does (greedy, and beam search
where the two length penalties agree), a client with only ctranslate2 and
sentencepiece gets the same, and every mistake is one line that writes nothing."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support.cli_helpers import assert_user_error, run_cli

from t2t_lite import registry
from t2t_lite.decoding.bleu import corpus_scores, read_lines

pytestmark = pytest.mark.slow

# Runs in a fresh interpreter: what docs/export.md shows a serving process doing.
_CLIENT = textwrap.dedent(
    """
    import json, sys
    import ctranslate2, sentencepiece as spm
    ct2_dir, vocab, lines = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
    sp = spm.SentencePieceProcessor(model_file=vocab)
    translator = ctranslate2.Translator(ct2_dir, device="cpu")
    results = translator.translate_batch(
        [sp.encode(line, out_type=str) for line in lines], beam_size=1
    )
    print(json.dumps([sp.decode(r.hypotheses[0]) for r in results]))
    print("t2t_lite" in sys.modules or "tensorflow" in sys.modules)
    """
)


@pytest.fixture(scope="module")
def converted(numbers_run, tmp_path_factory):
    """The numbers run converted twice: float32 and int8 weights."""
    root = tmp_path_factory.mktemp("ct2")
    dirs = {}
    for name, extra in (("float32", []), ("int8", ["--quantization=int8"])):
        dirs[name] = str(root / name)
        result = run_cli(
            "exporter",
            f"--output_dir={numbers_run.output_dir}",
            f"--data_dir={numbers_run.data_dir}",
            "--format=ctranslate2",
            f"--export_dir={dirs[name]}",
            *extra,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"wrote {dirs[name]}" in result.stdout
    return dirs


@pytest.fixture(scope="module")
def dev(numbers_run, tmp_path_factory):
    """60 dev sentences with an empty, a blank and an over-long line among them,
    as a file, and the references of the dev sentences."""
    data = numbers_run.data_dir
    sources = read_lines(os.path.join(data, "translate_numbers_en_fr-dev.source.txt"))
    targets = read_lines(os.path.join(data, "translate_numbers_en_fr-dev.target.txt"))
    lines = sources[:4] + [""] + sources[4:8] + ["   ", " ".join(sources[:3])]
    lines += sources[8:60]
    path = tmp_path_factory.mktemp("dev") / "source.en"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path, lines, sources[:60], targets[:60]


def _decode(numbers_run, source, out, settings, *engine):
    result = run_cli(
        "decoder",
        f"--output_dir={numbers_run.output_dir}",
        f"--data_dir={numbers_run.data_dir}",
        f"--decode_hparams={settings}",
        f"--decode_from_file={source}",
        f"--decode_to_file={out}",
        *engine,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return read_lines(str(out)), result.stderr


@pytest.mark.parametrize(
    "settings",
    [
        "beam_size=1,batch_size=7,max_input_length=9",
        # alpha 0: both rank by log-probability, so the same hypothesis wins.
        "beam_size=4,alpha=0.0,batch_size=16",
        # The two length penalties differ, yet on these short outputs the search
        # (with --ct2_patience's default) picks the same hypotheses.
        "beam_size=4,alpha=0.6",
        "beam_size=3,alpha=0.0,return_beams=true",
    ],
)
def test_ctranslate2_translates_as_the_tensorflow_decoder(
    numbers_run, converted, dev, tmp_path, settings
):
    source, lines, _, _ = dev
    engine = ["--engine=ctranslate2", f"--ct2_dir={converted['float32']}"]
    expected, _ = _decode(numbers_run, source, tmp_path / "tf.fr", settings)
    got, stderr = _decode(numbers_run, source, tmp_path / "ct2.fr", settings, *engine)
    assert "decoding with CTranslate2" in stderr
    assert len(got) == len(lines)
    beams = 3 if "return_beams" in settings else 1
    assert got[4] == got[9] == "\t" * (beams - 1)  # empty and blank lines: empty
    assert all(len(line.split("\t")) == beams for line in got)
    # The best hypothesis agrees; the n-best beyond it may not (docs/decoding.md):
    # the two searches stop at different points, so they have finished different
    # sets of hypotheses.
    assert [line.split("\t")[0] for line in got] == [
        line.split("\t")[0] for line in expected
    ]


def test_int8_weights_keep_the_bleu(numbers_run, converted, dev, tmp_path):
    """int8 (per-row scales) is an approximation: on this model it must keep the
    float32 conversion's BLEU within 2 points (it is ~98)."""
    _, _, sources, references = dev
    source = tmp_path / "dev.en"
    source.write_text("".join(f"{line}\n" for line in sources))
    bleu = {}
    for name, ct2_dir in converted.items():
        engine = ["--engine=ctranslate2", f"--ct2_dir={ct2_dir}"]
        out, _ = _decode(numbers_run, source, tmp_path / name, "beam_size=1", *engine)
        bleu[name] = corpus_scores(out, references).bleu
    with open(os.path.join(converted["int8"], "t2t_ctranslate2.json")) as f:
        info = json.load(f)
    assert info["quantization"] == "int8"
    assert os.path.getsize(
        os.path.join(converted["int8"], "model.bin")
    ) < 0.5 * os.path.getsize(os.path.join(converted["float32"], "model.bin"))
    assert bleu["float32"] > 90
    assert bleu["int8"] > bleu["float32"] - 2


def test_a_client_with_ctranslate2_and_sentencepiece_only(
    numbers_run, converted, dev, tmp_path
):
    """The directory holds what a serving process needs: the SentencePiece model
    beside the weights, and sources take SentencePiece's pieces as they come (the
    model appends EOS)."""
    source, lines, _, _ = dev
    expected, _ = _decode(numbers_run, source, tmp_path / "tf.fr", "beam_size=1")
    vocab = os.path.join(converted["float32"], "translate_numbers_en_fr.vocab.model")
    nonblank = [line for line in lines if line.strip()]
    request = tmp_path / "lines.json"
    request.write_text(json.dumps(nonblank))
    process = subprocess.run(
        [sys.executable, "-c", _CLIENT, converted["float32"], vocab, str(request)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    translations, imported = process.stdout.splitlines()[-2:]
    assert imported == "False"
    assert json.loads(translations) == [
        t for t, line in zip(expected, lines) if line.strip()
    ]


def test_separate_vocabularies_convert_and_decode(tmp_path):
    """One SentencePiece model per side, untrained weights: the engine's ids
    equal the library's Decoder's."""
    import tensorflow as tf

    from t2t_lite.data import datagen
    from t2t_lite.data.numbers_problem import TranslateNumbersEnFr
    from t2t_lite.decoding import ctranslate2_export
    from t2t_lite.decoding.ctranslate2_engine import CTranslate2Decoder
    from t2t_lite.decoding.decoder import Decoder, decode_hparams
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
    assert problem.source_vocab.path != problem.target_vocab.path
    hp = registry.HPARAMS_SETS.get("transformer_test")()
    tf.keras.utils.set_random_seed(5)
    model = build_model(registry.MODELS.get("transformer"), hp, problem.vocab_size)
    info = {"vocab_fingerprint": problem.vocab_fingerprint(), "max_input_length": 8}
    ct2_dir = str(tmp_path / "ct2")
    ctranslate2_export.convert(model, problem, ct2_dir, info)
    assert len([n for n in os.listdir(ct2_dir) if n.endswith(".model")]) == 2
    dhp = decode_hparams("beam_size=1,batch_size=2,extra_length=3")
    lines = ["one hundred", "", "seventy-seven thousand two", "nine", "   "]
    expected = Decoder(model, dhp, 8).translate(
        lines, problem.encode_inputs, problem.decode
    )
    got = CTranslate2Decoder(ct2_dir, dhp, 8, problem).translate(
        lines, problem.encode_inputs, problem.decode
    )
    assert [h[0][0] for h in got] == [h[0][0] for h in expected]


def test_a_model_that_does_not_map_is_refused_in_one_line(tmp_path):
    import tensorflow as tf

    from t2t_lite.decoding import ctranslate2_export
    from t2t_lite.errors import UserError
    from t2t_lite.models.transformer import Transformer

    class GeluTransformer(Transformer):
        """A user's variant: CTranslate2 could run it, the converter cannot know."""

    hp = registry.HPARAMS_SETS.get("transformer_test")()
    problem = registry.PROBLEMS.get("algorithmic_reverse")()
    tf.keras.utils.set_random_seed(1)
    model = Transformer.from_hparams(hp, problem.vocab_size)
    model({"inputs": tf.ones([1, 3], tf.int32), "targets": tf.ones([1, 3], tf.int32)})
    other = GeluTransformer.from_hparams(hp, problem.vocab_size)
    out = str(tmp_path / "out")
    cases = [
        (other, problem, ["class", "GeluTransformer"]),
        (model, problem, ["algorithmic_reverse", "no SentencePiece vocabulary"]),
    ]
    for candidate, the_problem, words in cases:
        with pytest.raises(UserError) as error:
            ctranslate2_export.convert(
                candidate, the_problem, out, {"max_input_length": 8}
            )
        assert "\n" not in str(error.value)
        for word in words:
            assert word in str(error.value)
    model.encoder_layers[0].ffn.filter_dense.activation = tf.nn.gelu
    found = ctranslate2_export.architecture(model)
    assert found["feed-forward"].startswith("gelu")
    with pytest.raises(UserError, match="feed-forward is 'gelu"):
        ctranslate2_export.check_convertible(model, problem)
    assert not os.path.exists(out)
    assert os.listdir(tmp_path) == []  # no staging directory left either


def test_bad_inputs_are_one_line_errors(numbers_run, converted, dev, tmp_path):
    run, data = (
        f"--output_dir={numbers_run.output_dir}",
        f"--data_dir={numbers_run.data_dir}",
    )
    source = f"--decode_from_file={dev[0]}"
    ct2 = "--format=ctranslate2"
    out = f"--export_dir={tmp_path / 'out'}"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    (tmp_path / "empty").mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "t2t_ctranslate2.json").write_text(
        json.dumps({"vocab_fingerprint": "sentencepiece:other", "max_positions": 9})
    )
    export_rows = [
        ([run, data, ct2, out, "--ids_only"], ["--ids_only", "savedmodel"]),
        ([run, data, ct2, out, "--decode_hparams=beam_size=2"], ["--decode_hparams"]),
        ([run, data, ct2, out, "--quantization=int9"], ["int9", "int8"]),
        ([run, data, out, "--quantization=int8"], ["--format=ctranslate2"]),
        ([run, data, ct2, f"--export_dir={tmp_path / 'full'}"], ["not empty"]),
    ]
    for args, words in export_rows:
        assert_user_error(run_cli("exporter", *args), "t2t-exporter", *words)
    decode_rows = [
        ([run, data, source, "--engine=ctranslate2"], ["needs --ct2_dir"]),
        ([run, data, source, f"--ct2_dir={converted['int8']}"], ["--engine"]),
        (
            [
                run,
                data,
                source,
                "--engine=ctranslate2",
                f"--ct2_dir={tmp_path / 'empty'}",
            ],
            ["t2t_ctranslate2.json", "--format=ctranslate2"],
        ),
        (
            [
                run,
                data,
                source,
                "--engine=ctranslate2",
                f"--ct2_dir={tmp_path / 'nope'}",
            ],
            ["not a directory"],
        ),
        (
            [run, data, source, "--engine=ctranslate2", f"--ct2_dir={other}"],
            ["another vocabulary"],
        ),
    ]
    for args, words in decode_rows:
        assert_user_error(run_cli("decoder", *args), "t2t-decoder", *words)
    assert (tmp_path / "full" / "x").read_text() == "keep me"  # nothing lost
    assert not (tmp_path / "out").exists()
