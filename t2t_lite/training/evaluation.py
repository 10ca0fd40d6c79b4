"""Evaluation: loss per token, token accuracy and sequence accuracy on the dev split."""

import tensorflow as tf

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

    def evaluate(self, dataset, max_batches):
        """Metrics over at most `max_batches` batches (all of them if max_batches <= 0)."""
        totals = dict.fromkeys(_SUMS, 0.0)
        for i, batch in enumerate(dataset):
            if 0 < max_batches <= i:
                break
            for key, value in self._step(batch).items():
                totals[key] += float(value)
        tokens = max(totals["tokens"], 1.0)
        return {
            "loss": totals["loss_sum"] / tokens,
            "accuracy": totals["correct_tokens"] / tokens,
            "sequence_accuracy": (
                totals["correct_sequences"] / max(totals["sequences"], 1.0)
            ),
            "eval_tokens": int(totals["tokens"]),
        }
