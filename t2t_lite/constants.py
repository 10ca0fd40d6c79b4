"""Ids and constants every layer agrees on (T2T's conventions).

Id 0 is padding and never counts in a loss or metric; id 1 ends a sequence. Vocabularies
(SentencePiece included) are built so that these hold.
"""

PAD_ID = 0
EOS_ID = 1
NEG_INF = -1e9  # T2T's large negative attention bias / score for excluded positions

# What an evaluation reports (metrics.jsonl, TensorBoard eval/, the best checkpoint,
# early stopping, t2t-plot): bleu only for problems with dev text and BLEU enabled.
EVAL_METRICS = ("loss", "accuracy", "sequence_accuracy", "bleu")
# How the batch went (TensorBoard train/, metrics.jsonl, t2t-plot): the planned tokens
# per update and the gradient noise scale (training/step/noise_scale.py), both in tokens.
BATCH_CURVES = ("noise_scale", "tokens_per_update")
