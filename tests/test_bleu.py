"""Corpus BLEU/chrF: sacrebleu's numbers and signatures, one-line errors for bad
files, and t2t-bleu as a user runs it."""

import pytest
import sacrebleu
from support.cli_helpers import assert_user_error, run_cli

from t2t_lite.decoding import bleu
from t2t_lite.errors import UserError

REFERENCE = [
    "The cat sat on the mat.",
    "Hello, world!",
    "Machine translation is hard to evaluate well.",
]
PARTIAL = [
    "The cat sat on a mat.",
    "Hello world!",
    "Translation by machine is hard to judge.",
]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_identical_text_scores_100():
    scores = bleu.corpus_scores(REFERENCE, REFERENCE)
    assert scores.bleu == pytest.approx(100.0)  # sacrebleu's exp(log) rounding
    assert scores.chrf == pytest.approx(100.0)
    assert "tok:13a" in scores.bleu_signature
    assert "nc:6" in scores.chrf_signature


def test_partial_match_equals_sacrebleu():
    scores = bleu.corpus_scores(PARTIAL, REFERENCE)
    assert 0 < scores.bleu < 100 and 0 < scores.chrf < 100
    assert scores.bleu == sacrebleu.corpus_bleu(PARTIAL, [REFERENCE]).score
    assert scores.chrf == sacrebleu.corpus_chrf(PARTIAL, [REFERENCE]).score
    lowercase = bleu.corpus_scores(PARTIAL, REFERENCE, lowercase=True)
    assert "case:lc" in lowercase.bleu_signature


def test_line_counts_must_match():
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        bleu.corpus_scores(PARTIAL[:2], REFERENCE)
    with pytest.raises(UserError, match="no sentences"):
        bleu.corpus_scores([], [])


def test_unknown_tokenizer_is_one_line():
    with pytest.raises(UserError, match="unknown BLEU tokenizer 'nope'"):
        bleu.corpus_scores(PARTIAL, REFERENCE, tokenize="nope")


def test_read_lines_strips_only_the_line_break(tmp_path):
    path = tmp_path / "text"
    path.write_bytes("\ufeff a b \r\n\nc\td  \nlast".encode())
    assert bleu.read_lines(str(path)) == [" a b ", "", "c\td  ", "last"]


def test_read_lines_errors_name_file_and_line(tmp_path):
    with pytest.raises(UserError, match=r"missing\.txt: no such file"):
        bleu.read_lines(str(tmp_path / "missing.txt"))
    path = tmp_path / "latin1.txt"
    path.write_bytes("fine\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1.txt:2: not valid UTF-8") as e:
        bleu.read_lines(str(path))
    assert "\n" not in str(e.value)


# --- t2t-bleu as a user runs it --------------------------------------------------------


def test_cli(tmp_path):
    hyp, ref = _write(tmp_path / "hyp", PARTIAL), _write(tmp_path / "ref", REFERENCE)
    short = _write(tmp_path / "short", PARTIAL[:2])

    result = run_cli("bleu", f"--translation={hyp}", f"--reference={ref}")
    assert result.returncode == 0, result.stderr[-2000:]
    expected = bleu.corpus_scores(PARTIAL, REFERENCE)
    assert result.stdout.splitlines() == [
        f"BLEU = {expected.bleu:.2f}  (signature {expected.bleu_signature})",
        f"chrF = {expected.chrf:.2f}  (signature {expected.chrf_signature})",
    ]
    bad = {
        "has 2 lines but": [f"--translation={short}", f"--reference={ref}"],
        "no such file": [f"--translation={hyp}", f"--reference={tmp_path}/no"],
        "--reference is required": [f"--translation={hyp}"],
    }
    for words, args in bad.items():
        assert_user_error(run_cli("bleu", *args), "t2t-bleu", words)
