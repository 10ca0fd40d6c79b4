"""Evaluation: loss per token, token accuracy and sequence accuracy on the dev split."""

import tensorflow as tf

from t2t_lite.errors import UserError

from t2t_lite.models.transformer import token_accuracy, token_loss

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
        self._step = tf.function(self._batch_sums, input_signature=_BATCH_SIGNATURE)

    def _batch_sums(self, batch):
        logits = self.model(batch, training=False)  # [batch, length, vocab]
        loss_sum, tokens = token_loss(logits, batch["targets"], self.label_smoothing)
        correct, _, correct_seqs, seqs = token_accuracy(logits, batch["targets"])
        return dict(zip(_SUMS, (loss_sum, tokens, correct, correct_seqs, seqs)))

    def evaluate(self, dataset, max_batches, should_stop=lambda: False):
        """Metrics over at most `max_batches` batches (all of them if max_batches <= 0).

        Sums stay on the device until the end (one host sync per evaluation).
        `should_stop` is polled between batches so a pre-emption signal does not
        wait for a whole dev set. Returns None if it stopped early.
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
            raise UserError("the dev split produced no target tokens to evaluate on.")
        totals = {k: float(v) for k, v in totals.items()}
        return {
            "loss": totals["loss_sum"] / totals["tokens"],
            "accuracy": totals["correct_tokens"] / totals["tokens"],
            "sequence_accuracy": totals["correct_sequences"] / totals["sequences"],
            "eval_tokens": int(totals["tokens"]),
        }
