"""The train → average → decode → BLEU path through the CLIs, and t2t-decoder's
bad-input table (one line "t2t-decoder: error: ...", no traceback).

One decoder run is a subprocess (end to end, in parallel with the in-process
averaging); the others run in-process."""

import os

import pytest
from support.cli_helpers import (
    assert_user_error,
    finish_cli,
    run_cli,
    start_cli,
)

from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import TranslateNumbersEnFr
from t2t_lite.decoding.bleu import corpus_scores, read_lines
from t2t_lite.decoding.decoder import Decoder, decode_hparams
from t2t_lite.decoding.loading import load_for_decoding


@pytest.fixture(scope="module")
def dev_files(numbers_run, tmp_path_factory):
    """A source file of 30 dev sentences with an empty line and an over-long line
    inside, and the matching references (empty/long lines excluded)."""
    sources = read_lines(
        os.path.join(numbers_run.data_dir, "translate_numbers_en_fr-dev.source.txt")
    )[:30]
    references = read_lines(
        os.path.join(numbers_run.data_dir, "translate_numbers_en_fr-dev.target.txt")
    )[:30]
    lines = sources[:10] + [""] + sources[10:20] + [" ".join(sources)] + sources[20:]
    root = tmp_path_factory.mktemp("decode")
    source_file, reference_file = root / "dev.en", root / "dev.fr"
    source_file.write_text("".join(f"{line}\n" for line in lines))
    reference_file.write_text("".join(f"{line}\n" for line in references))
    return root, lines, sources


def test_train_average_decode_bleu(numbers_run, dev_files):
    root, lines, _ = dev_files
    run, avg = numbers_run.output_dir, str(root / "avg")
    common = [f"--data_dir={numbers_run.data_dir}", "--decode_hparams=beam_size=4"]
    decoding = start_cli(  # end to end, while this process averages
        "decoder",
        f"--output_dir={run}",
        *common,
        f"--decode_from_file={root / 'dev.en'}",
        f"--decode_to_file={root / 'out.fr'}",
    )
    result = run_cli(
        "avg_checkpoints", f"--model_dir={run}", f"--output_dir={avg}", "--n=2"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "steps 150, 300" in result.stdout
    result = run_cli(
        "decoder",
        f"--output_dir={avg}",
        *common,
        f"--decode_from_file={root / 'dev.en'}",
        f"--decode_to_file={root / 'avg.fr'}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    result = finish_cli(decoding)
    assert result.returncode == 0, result.stderr[-2000:]

    outputs = read_lines(str(root / "out.fr"))
    assert len(outputs) == len(lines)  # order and count kept, empty line included
    assert outputs[10] == ""
    assert outputs[21]  # the over-long line was truncated, not dropped

    # The CLI's output is the library's, line for line.
    model, problem, hp, _ = load_for_decoding(
        output_dir=run,
        data_dir=numbers_run.data_dir,
    )
    decoder = Decoder(model, decode_hparams("beam_size=4"), hp.max_length)
    expected = decoder.translate(lines, problem.encode_inputs, problem.decode)
    assert outputs == [h[0][0] for h in expected]

    # Without the empty and the long line, the output aligns with the references.
    kept = [o for i, o in enumerate(outputs) if i not in (10, 21)]
    (root / "kept.fr").write_text("".join(f"{line}\n" for line in kept))
    bleu = run_cli(
        "bleu", f"--translation={root / 'kept.fr'}", f"--reference={root / 'dev.fr'}"
    )
    assert bleu.returncode == 0, bleu.stderr[-2000:]
    first = bleu.stdout.splitlines()[0]
    assert first.startswith("BLEU = ") and "nrefs:1" in first
    assert float(first.split()[2]) > 50
    averaged = read_lines(str(root / "avg.fr"))
    assert len(averaged) == len(lines)
    kept_averaged = [o for i, o in enumerate(averaged) if i not in (10, 21)]
    assert corpus_scores(kept_averaged, read_lines(str(root / "dev.fr"))).bleu > 50


def test_interactive_mode_prints_one_line_per_input(numbers_run, dev_files):
    _, _, sources = dev_files
    result = run_cli(
        "decoder",
        f"--output_dir={numbers_run.output_dir}",
        f"--data_dir={numbers_run.data_dir}",
        "--decode_interactive",
        "--decode_hparams=beam_size=2,return_beams=true,write_beam_scores=true",
        stdin_text=f"{sources[0]}\n\n{sources[1]}\n",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout.splitlines()
    assert len(out) == 3
    first = out[0].split("\t")
    assert len(first) == 4  # two beams, each "text<TAB>score"
    assert float(first[1]) >= float(first[3])
    assert out[1].split("\t") == ["", "0.0000", "", "0.0000"]  # columns kept


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("other") / "data")
    datagen.generate(
        TranslateNumbersEnFr(train_size=500, dev_size=20),
        data_dir,
        config=datagen.DatagenConfig(num_shards=1, vocab_size=60),
        log=lambda _: None,
    )
    return data_dir


def test_bad_inputs_are_one_line_errors(numbers_run, dev_files, other_vocab_dir):
    root, _, _ = dev_files
    (root / "bad.en").write_bytes(b"one\n\xff\xfe two\n")
    (root / "empty_run").mkdir(exist_ok=True)
    run = f"--output_dir={numbers_run.output_dir}"
    data = f"--data_dir={numbers_run.data_dir}"
    source = f"--decode_from_file={root / 'dev.en'}"
    rows = [
        ([run, data, f"--decode_to_file={root / 'no' / 'x.fr'}"], ["--decode_to_file"]),
        ([run, data, f"--decode_from_file={root / 'missing.en'}"], ["missing.en"]),
        ([run, data, source, "--decode_hparams=beam_size=0"], ["beam_size", ">= 1"]),
        ([run, data, source, "--decode_hparams=beam=4"], ["beam", "beam_size"]),
        ([run, data, source, "--hparams_set=transformer_base"], ["hidden_size"]),
        ([run, data, source, "--problem=algorithmic_reverse"], ["problem"]),
        ([f"--output_dir={root / 'empty_run'}", data, source], ["hparams.json"]),
        ([run, data, source, f"--checkpoint_path={root / 'nope'}"], ["nope"]),
        ([run, f"--data_dir={root / 'nodata'}", source], ["nodata"]),
        ([run, f"--data_dir={other_vocab_dir}", source], ["vocabulary"]),
        ([run, data, f"--decode_from_file={root / 'bad.en'}"], ["bad.en:2", "UTF-8"]),
        ([run, data, source, "--decode_interactive"], ["--decode_interactive"]),
        ([f"--output_dir={root / 'dev.en'}", data, source], ["not a directory"]),
    ]
    for args, words in rows:
        assert_user_error(run_cli("decoder", *args), "t2t-decoder", *words)


def test_without_a_file_the_dev_set_is_decoded_and_scored(numbers_run, tmp_path):
    """T2T's default: no --decode_from_file decodes the problem's dev set."""
    out = tmp_path / "dev.decoded.fr"
    result = run_cli(
        "decoder",
        f"--output_dir={numbers_run.output_dir}",
        f"--data_dir={numbers_run.data_dir}",
        f"--decode_to_file={out}",
        "--decode_hparams=beam_size=2",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    bleu_line = result.stdout.splitlines()[0]
    assert bleu_line.startswith("BLEU = ") and float(bleu_line.split()[2]) > 50
    assert result.stdout.splitlines()[1].startswith("chrF = ")
    assert len(read_lines(str(out))) == 200  # the fixture's dev set
