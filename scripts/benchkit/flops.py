"""Model FLOPs utilization (MFU): the training FLOPs of a Transformer on given
batches, and this machine's tf.matmul peak to divide them by.

A count of matmul FLOPs, not a profile: it says how far a framework is from the
machine's own dense-matmul speed, which is comparable across frameworks."""

import time

import numpy as np

from benchkit.peers.corpus import target_tokens


def training_flops(batches, spec):
    """(training FLOPs of one pass over `batches`, their non-pad target tokens).

    Matmul FLOPs only (2 per multiply-add), forward x 3 for forward + backward, over
    non-pad tokens (padding is waste, not model FLOPs); layer norms, softmaxes and
    embedding lookups are left out. d = hidden, f = filter, V = vocab, L = layers;
    per sentence pair of source length s and target length t (EOS included):

      forward = s * L * (8 d^2 + 4 d f)          encoder: q, k, v, o + feed-forward
              + s * L * 4 d^2                     decoder cross-attention k, v
              + t * L * (12 d^2 + 4 d f)          decoder: self q, k, v, o, cross q, o,
                                                  feed-forward
              + t * 2 d V                         softmax (shared embedding matrix)
              + 4 d L (s^2 + t^2 + s t)           attention scores and weighted sums
                                                  (self: full square, as computed)
      training = 3 * forward

    With s = t this is 6 x (non-embedding parameters + d V) per token plus the
    attention terms: the usual "6N" estimate.
    """
    d, f, v, n = (
        spec[k] for k in ("hidden_size", "filter_size", "vocab_size", "num_layers")
    )
    total = 0.0
    for batch in batches:
        s = np.count_nonzero(batch["inputs"], axis=1).astype(np.float64)
        t = np.count_nonzero(batch["targets"], axis=1).astype(np.float64)
        forward = (
            s.sum() * n * (12 * d * d + 4 * d * f)
            + t.sum() * (n * (12 * d * d + 4 * d * f) + 2 * d * v)
            + 4 * d * n * (s * s + t * t + s * t).sum()
        )
        total += 3 * forward
    return total, target_tokens(batches)


def matmul_peak(dtype_name, size=2048, repeats=5):
    """FLOP/s of the best of `repeats` tf.matmul of two size x size matrices."""
    import tensorflow as tf

    dtype = tf.as_dtype(dtype_name)
    a = tf.cast(tf.random.normal([size, size]), dtype)
    b = tf.cast(tf.random.normal([size, size]), dtype)
    float(tf.reduce_sum(tf.matmul(a, b)[0, :1]))  # warmup: oneDNN builds its kernel
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        float(tf.matmul(a, b)[0, 0])
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def measure_peaks(peaks=None, size=2048):
    """Both peaks, keeping the better of this and an earlier measurement."""
    peaks = dict(peaks or {})
    for dtype in ("float32", "bfloat16"):
        peaks[dtype] = max(peaks.get(dtype, 0.0), matmul_peak(dtype, size))
    return peaks
