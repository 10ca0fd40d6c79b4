"""Corpus BLEU and chrF via sacrebleu, with the signatures that make them comparable.

T2T's own BLEU (bleu_hook) tokenized its own way, so its numbers matched nothing else;
sacrebleu's scores come with a signature (tokenizer, casing, smoothing, version) that
says exactly what was computed, and with tokenize="13a" they are the WMT numbers.
"""

import dataclasses
import os

from sacrebleu.metrics import BLEU, CHRF

from t2t_lite.errors import UserError

TOKENIZERS = tuple(BLEU.TOKENIZERS)  # "13a" (WMT default), "intl", "zh", "char", ...
_BOM = "\ufeff"


@dataclasses.dataclass(frozen=True)
class Scores:
    """Corpus scores in [0, 100] and the sacrebleu signatures to report with them."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str


def read_lines(path):
    """The lines of a UTF-8 text file, each without its line break ("\\n" or "\\r\\n").

    Nothing else is stripped: scoring decides what whitespace means. Only "\\n" ends a
    line (a stray U+2028 must not shift the alignment); a byte-order mark at the
    start is dropped. A missing file or bytes that are not UTF-8 are one-line
    UserErrors naming the file (and line).
    """
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "no such file"
        raise UserError(f"{path}: {what}; expected a UTF-8 text file.")
    lines = []
    try:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                lines.append(_decode(path, number, raw))
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror}).") from None
    if lines and lines[0].startswith(_BOM):
        lines[0] = lines[0][1:]
    return lines


def _decode(path, number, raw):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}:{number}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
            f"{e.start + 1}); convert the file to UTF-8, e.g. with iconv."
        ) from None
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    return text


def _metrics(tokenize, lowercase):
    if tokenize not in TOKENIZERS:
        raise UserError(
            f"unknown BLEU tokenizer {tokenize!r}; expected one of "
            f"{', '.join(TOKENIZERS)}."
        )
    try:
        return BLEU(tokenize=tokenize, lowercase=lowercase), CHRF(lowercase=lowercase)
    except (ImportError, RuntimeError, OSError) as e:
        # ja-mecab/ko-mecab need extra packages; flores/spm download a model.
        reason = next((line for line in str(e).splitlines() if line.strip()), "")
        raise UserError(
            f"BLEU tokenizer {tokenize!r} is unavailable: {reason.strip()}"
        ) from None


def corpus_scores(hypotheses, references, tokenize="13a", lowercase=False):
    """Corpus BLEU and chrF of `hypotheses` against one reference per line.

    tokenize: a sacrebleu BLEU tokenizer ("13a" is the WMT standard; chrF works on
    characters and has none). Raises UserError (a ValueError) when the two lists
    differ in length or are empty.
    """
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise UserError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; "
            "they must be line-aligned."
        )
    if not hypotheses:
        raise UserError("no sentences to score.")
    bleu, chrf = _metrics(tokenize, lowercase)
    return Scores(
        bleu=float(bleu.corpus_score(hypotheses, [references]).score),
        chrf=float(chrf.corpus_score(hypotheses, [references]).score),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
    )
