"""Evaluation: loss per token, token accuracy and sequence accuracy on the dev split
(or the test split, with the trainer's eval_use_test_set)."""

import tensorflow as tf

from t2t_lite.decoding.bleu import corpus_scores
from t2t_lite.decoding.decoder import Decoder
from t2t_lite.errors import UserError
from t2t_lite.graph import graph_function
from t2t_lite.models.losses import token_accuracy, token_loss

_BATCH_SIGNATURE = (
    {
        "inputs": tf.TensorSpec([None, None], tf.int32),
        "targets": tf.TensorSpec([None, None], tf.int32),
    },
)

_SUMS = ("loss_sum", "tokens", "correct_tokens", "correct_sequences", "sequences")


class Evaluator:
    """Sums metric counts over batches and turns them into per-token/sequence ratios."""

    def __init__(self, model, label_smoothing):
        self.model = model
        self.label_smoothing = label_smoothing
        self._step = graph_function(self._batch_sums, input_signature=_BATCH_SIGNATURE)

    def _batch_sums(self, batch):
        logits = self.model(batch, training=False)  # [batch, length, vocab]
        loss_sum, tokens = token_loss(logits, batch["targets"], self.label_smoothing)
        correct, _, correct_seqs, seqs = token_accuracy(logits, batch["targets"])
        return dict(zip(_SUMS, (loss_sum, tokens, correct, correct_seqs, seqs)))

    def evaluate(self, dataset, max_batches, should_stop=lambda: False, split="dev"):
        """Metrics over at most `max_batches` batches (all of them if max_batches <= 0).

        Sums stay on the device until the end (one host sync per evaluation).
        `should_stop` is polled between batches so a pre-emption signal does not
        wait for a whole dev set. Returns None if it stopped early. `split` names
        the data in the error for an empty one.
        """
        totals = None
        for i, batch in enumerate(dataset):
            if 0 < max_batches <= i:
                break
            if should_stop():
                return None
            sums = self._step(batch)
            totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
        if totals is None or float(totals["tokens"]) == 0:
            raise UserError(
                f"the {split} split produced no target tokens to evaluate on."
            )
        totals = {k: float(v) for k, v in totals.items()}
        return {
            "loss": totals["loss_sum"] / totals["tokens"],
            "accuracy": totals["correct_tokens"] / totals["tokens"],
            "sequence_accuracy": totals["correct_sequences"] / totals["sequences"],
            "eval_tokens": int(totals["tokens"]),
        }


class BleuEvaluator:
    """Decodes (a slice of) the dev (or test) source text and scores it against the
    references.

    Teacher-forced accuracy says little about translations the model produces on its
    own; T2T's in-graph "approx BLEU" had the same blind spot. This runs the real
    decoder (greedy by default: a cheap trend; t2t-decoder gives the final BLEU).
    """

    def __init__(
        self, model, problem, decode_hp, max_sentences, max_input_length, split="dev"
    ):
        self.model = model
        self.problem = problem
        self.decoder = Decoder(
            model, decode_hp, max_input_length, flag="eval_decode_hparams"
        )
        # Read now: a missing text file fails at start-up, not hours later.
        sources, references = (
            problem.dev_text() if split == "dev" else problem.split_text(split)
        )
        if max_sentences > 0:
            sources, references = sources[:max_sentences], references[:max_sentences]
        self._text = sources, references

    def evaluate(self, should_stop=lambda: False):
        """{"bleu": corpus BLEU, "bleu_sentences": n}, or None if stopped."""
        sources, references = self._text
        results = self.decoder.translate(
            sources, self.problem.encode_inputs, self.problem.decode, should_stop
        )
        if results is None:
            return None
        hypotheses = [hyps[0][0] for hyps in results]
        scores = corpus_scores(hypotheses, references)
        return {"bleu": scores.bleu, "bleu_sentences": len(sources)}
