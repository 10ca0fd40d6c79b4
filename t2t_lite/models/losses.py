"""Losses and metrics of sequence models: summed over non-pad target tokens.

Model-agnostic (any model giving logits [batch, length, vocab] for targets
[batch, length]), so the train step and evaluation never import a model's file.
Losses are returned as (sum, token count), not means: the train step normalizes
once per update over all micro-batches and replicas (docs/design.md §2).
"""

import tensorflow as tf

from t2t_lite.constants import PAD_ID


def _nonpad_weights(targets):
    """1.0 on real target tokens, 0.0 on padding (id 0). [batch, length]."""
    return tf.cast(tf.not_equal(targets, PAD_ID), tf.float32)


def token_loss(logits, targets, label_smoothing):
    """T2T label-smoothed cross entropy, summed over non-pad tokens.

    logits [batch, length, vocab]; targets int [batch, length]. The true id gets
    1 - label_smoothing, the other vocab-1 ids share label_smoothing; the minimum
    (entropy of that distribution) is subtracted so the best prediction scores 0.
    Returns (loss_sum, num_tokens), float32 scalars, NOT normalized.
    """
    logits = tf.cast(logits, tf.float32)
    targets = tf.cast(targets, tf.int32)
    vocab_size = logits.shape[-1] or tf.shape(logits)[-1]
    vocab_f = tf.cast(vocab_size, tf.float32)
    confidence = 1.0 - label_smoothing
    low_confidence = (1.0 - confidence) / (vocab_f - 1.0)
    normalizing = -(
        confidence * tf.math.log(confidence)
        + (vocab_f - 1.0) * low_confidence * tf.math.log(low_confidence + 1e-20)
    )
    xent = smoothed_cross_entropy(
        tf.reshape(logits, [-1, vocab_size]),
        tf.reshape(targets, [-1]),
        confidence,
        low_confidence,
    )  # [batch * length]
    weights = tf.reshape(_nonpad_weights(targets), [-1])  # [batch * length]
    loss_sum = tf.reduce_sum((xent - normalizing) * weights)
    return loss_sum, tf.reduce_sum(weights)


def smoothed_cross_entropy(logits, labels, confidence, low_confidence):
    """-sum_v q_v log softmax(logits)_v per row, q = low_confidence everywhere and
    confidence at the label (sum_v q_v = 1). logits float32 [rows, vocab]; labels
    int32 [rows] -> [rows].

    Neither the [rows, vocab] smoothed targets (T2T builds a one-hot) nor a
    gather from the logits (whose gradient TF scatters into a zeroed
    [rows, vocab] buffer: the largest non-matmul op of the step, measured) is
    made. One fused kernel gives log-sum-exp and softmax - onehot; with them
    the loss is nll + (1 - confidence + low)·z_label - low·sum_v z_v (nll =
    lse - z_label), and its gradient softmax - q is the kernel's
    (softmax - onehot) - low, plus (1 - confidence + low) at the label.
    """

    @tf.custom_gradient
    def cross_entropy(z):
        nll, softmax_minus_onehot = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
            features=z, labels=labels
        )  # [rows], [rows, vocab]
        label_boost = 1.0 - confidence + low_confidence
        label_logits = tf.gather(z, labels, batch_dims=1)  # [rows]; no gradient
        xent = nll + label_boost * label_logits - low_confidence * tf.reduce_sum(z, -1)

        def grad(upstream):  # [rows]
            dz = (softmax_minus_onehot - low_confidence) * upstream[:, None]
            at_labels = tf.stack([tf.range(tf.shape(labels)[0]), labels], axis=1)
            return tf.tensor_scatter_nd_add(dz, at_labels, label_boost * upstream)

        return xent, grad

    return cross_entropy(logits)


def token_accuracy(logits, targets):
    """Padding-aware accuracy counts, float32 scalars:
    (num_correct_tokens, num_tokens, num_correct_sequences, num_sequences).

    A sequence is correct when all its non-pad tokens are (T2T's
    padded_sequence_accuracy); sequences made only of padding are not counted.
    """
    targets = tf.cast(targets, tf.int32)
    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [batch, length]
    weights = _nonpad_weights(targets)
    correct = tf.cast(tf.equal(predictions, targets), tf.float32) * weights
    wrong_per_sequence = tf.reduce_sum(weights - correct, axis=-1)  # [batch]
    nonempty = tf.cast(tf.reduce_sum(weights, axis=-1) > 0, tf.float32)  # [batch]
    correct_sequences = tf.cast(tf.equal(wrong_per_sequence, 0), tf.float32) * nonempty
    return (
        tf.reduce_sum(correct),
        tf.reduce_sum(weights),
        tf.reduce_sum(correct_sequences),
        tf.reduce_sum(nonempty),
    )
