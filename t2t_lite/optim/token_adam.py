"""Adam whose moment decays keep a fixed half-life in tokens when the batch changes
(hparam adam_beta_tokens_reference; docs/batch.md).

Adam's β2 = 0.997 averages the squared gradient over about 1 / (1 − β2) updates. When
updates grow from 4k to 64k tokens, that is 16 times more data, so the second moment
forgets the early, noisier gradients more slowly in data than it did in the reference
setting. Marek et al. (2025, "Small batch size training for language models") keep
the half-life of β2 fixed in tokens: β2(u) = β2 ^ (tokens(u) / R), where R is the
batch size at which β2 takes its nominal value. An update of 2R tokens decays the
moment as two updates of R would. With adam_beta1_follows_tokens, β1 follows the same
rule.

Bias correction stays exact: Adam's 1 − β^t becomes 1 − Π_{v≤u} β(v), and since
β(v) = β^(tokens(v) / R), the product is β ^ (planned tokens of updates 0..u / R),
read off the run's BatchClock (optim/schedule.py). Nothing else is stored, so the
checkpoint is Adam's own.
"""

import tensorflow as tf

from t2t_lite.optim.fused import FusedAdam


class TokenHalfLifeAdam(FusedAdam):
    """Adam (optim/fused.py) with β(u) = β ^ (tokens(u) / reference_tokens)."""

    def __init__(self, clock, reference_tokens, beta_1_follows=False, **kwargs):
        super().__init__(**kwargs)
        self.clock = clock
        self.reference_tokens = float(reference_tokens)
        self.beta_1_follows = beta_1_follows

    def betas(self):
        """(β1, β2, Π β1, Π β2) of the update being applied, float32 tensors."""
        window = tf.cast(self.clock.window_tokens, tf.float64)
        trained = tf.cast(self.clock.tokens_trained, tf.float64)
        now = tf.cast(window / self.reference_tokens, tf.float32)
        total = tf.cast((trained + window) / self.reference_tokens, tf.float32)
        beta_2, power_2 = self.beta_2**now, self.beta_2**total
        if self.beta_1_follows:
            beta_1, power_1 = self.beta_1**now, self.beta_1**total
        else:
            beta_1 = tf.constant(self.beta_1, tf.float32)
            power_1 = self.beta_1 ** tf.cast(self.iterations + 1, tf.float32)
        return beta_1, beta_2, power_1, power_2

    def get_config(self):  # lives only inside a run: never serialized
        raise NotImplementedError("a TokenHalfLifeAdam is not serializable")
