"""Decoding through CTranslate2: the TensorFlow decoder's interface (decode_ids,
translate, truncation and batching are `BatchedDecoder`'s) over a model directory
that `t2t-exporter --format=ctranslate2` wrote.

Ids go in and come out, so t2t-decoder's SentencePiece pre- and post-processing,
output order and BLEU scoring are the TensorFlow path's own; only the search runs in
CTranslate2. What differs from the TensorFlow search (docs/decoding.md):

- the length penalty: CTranslate2 divides a hypothesis's log-probability by
  length^alpha, T2T's GNMT penalty by ((5 + length) / 6)^alpha. Both rank
  hypotheses of equal length alike, and alpha 0 is the plain log-probability in
  both; other alphas can pick a different hypothesis among unequal lengths.
- the scores reported are CTranslate2's (normalized as above).
- when a sentence's search stops: CTranslate2 stops once beam_size × patience
  hypotheses have finished; T2T's search goes on while an unfinished hypothesis
  could still win. With patience 1 the best output differed from the TensorFlow
  path's on 14 of 200 numbers dev sentences at alpha 0.6, with 2 on none (the
  model of tests/conftest.py): t2t-decoder's default is 2 (--ct2_patience).
"""

from t2t_lite.decoding.ctranslate2_export import _ctranslate2, read_info
from t2t_lite.decoding.decoder import BatchedDecoder, Hypothesis
from t2t_lite.errors import UserError


class CTranslate2Decoder(BatchedDecoder):
    """Greedy (beam_size 1) or beam search in CTranslate2, batch by batch."""

    def __init__(
        self,
        ct2_dir,
        hp,
        max_input_length,
        problem,
        device="cpu",
        compute_type="default",
        threads=0,
        patience=2.0,
        flag="--ct2_dir",
    ):
        """ct2_dir: a converted model; hp, max_input_length: as Decoder's;
        problem: the run's (its vocabulary must be the one converted with);
        threads: CTranslate2's intra_threads (0: its default); patience: beam
        search continues until beam_size × patience hypotheses have finished
        (see the module's docstring)."""
        ctranslate2 = _ctranslate2()
        info = read_info(ct2_dir, flag)
        if info.get("vocab_fingerprint") != problem.vocab_fingerprint():
            raise UserError(
                f"{flag} '{ct2_dir}' was converted with another vocabulary than "
                "this run's data_dir holds."
            )
        super().__init__(hp, max_input_length)
        self.info = info
        self.patience = patience
        # Beyond its position table CTranslate2 cannot decode (ctranslate2_export).
        self.max_positions = info["max_positions"]
        self.max_input_length = min(self.max_input_length, self.max_positions - 1)
        try:
            self.translator = ctranslate2.Translator(
                ct2_dir,
                device=device,
                compute_type=compute_type,
                intra_threads=threads,
            )
        except (RuntimeError, ValueError) as e:
            raise UserError(f"{flag} '{ct2_dir}': {e}") from None
        # The converted vocabularies are the problem's pieces in id order.
        source, target = problem.source_vocab, problem.target_vocab
        self._source_piece = [source.id_to_piece(i) for i in range(source.size)]
        self._target_id = {target.id_to_piece(i): i for i in range(target.size)}

    def _decode_batch(self, sources):
        hp = self.hp
        keep = hp.beam_size if hp.return_beams else 1
        # CTranslate2 appends EOS itself (add_source_eos), as it does for a client
        # passing SentencePiece pieces.
        tokens = [[self._source_piece[i] for i in s[:-1]] for s in sources]
        width = max(len(s) for s in sources)
        results = self.translator.translate_batch(
            tokens,
            beam_size=hp.beam_size,
            num_hypotheses=keep,
            patience=self.patience,
            length_penalty=hp.alpha,
            max_input_length=0,  # truncated already, as the TensorFlow path does
            max_decoding_length=min(width + hp.extra_length, self.max_positions),
            return_scores=True,
            suppress_sequences=[["<pad>"]],  # never chosen, as in decoding/search.py
        )
        return [
            [
                Hypothesis(
                    self._strip([self._target_id[p] for p in hypothesis]), float(score)
                )
                for hypothesis, score in zip(result.hypotheses, result.scores)
            ]
            for result in results
        ]
