"""Corpus BLEU and chrF via sacrebleu, with the signatures that make them comparable.

T2T's own BLEU (bleu_hook) tokenized its own way, so its numbers matched nothing else;
sacrebleu's scores come with a signature (tokenizer, casing, smoothing, version) that
says exactly what was computed, and with tokenize="13a" they are the WMT numbers.
"""

import dataclasses

from sacrebleu.metrics import BLEU, CHRF

from t2t_lite.data import text_io
from t2t_lite.errors import UserError, first_line

TOKENIZERS = tuple(BLEU.TOKENIZERS)  # "13a" (WMT default), "intl", "zh", "char", ...


@dataclasses.dataclass(frozen=True)
class Scores:
    """Corpus scores in [0, 100] and the sacrebleu signatures to report with them."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str


def read_lines(path):
    """The lines of a UTF-8 text file (plain or .gz), each without its line break.

    Nothing else is stripped: scoring decides what whitespace means. Errors are
    text_io's one-line DataFileErrors naming the file (and line).
    """
    return [text for _, text in text_io.read_lines(path, strip=False)]


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
        raise UserError(
            f"BLEU tokenizer {tokenize!r} is unavailable: {first_line(e)}"
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
