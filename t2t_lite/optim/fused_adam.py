"""Adam whose update of a variable is one kernel: TensorFlow's ApplyAdam.

keras.optimizers.Adam writes the update as a dozen element-wise ops per variable
(m, v, their bias corrections, the step), each a pass over the variable's memory and,
in a traced step, some forty graph ops to build and optimize. TensorFlow's fused
ApplyAdam kernel (the one tf.train.AdamOptimizer, hence T2T, used) does the same
arithmetic in one pass: on transformer_base's 60M weights on a CPU it applies an
update in about 0.4× the time, and the step traces and compiles its update in about
half the time (docs/benchmarks.md, "Fused Adam"). The formula is Keras's, so results
agree to float rounding, and the moments are Keras's variables: checkpoints are
the same either way.
"""

import keras
import tensorflow as tf


class FusedAdam(keras.optimizers.Adam):
    """keras.optimizers.Adam (without amsgrad) through TensorFlow's ApplyAdam."""

    def betas(self):
        """(β1, β2, β1^t, β2^t) of the update being applied (t counts from 1),
        float32 tensors; subclasses change how the betas move."""
        t = tf.cast(self.iterations + 1, tf.float32)
        beta_1 = tf.constant(self.beta_1, tf.float32)
        beta_2 = tf.constant(self.beta_2, tf.float32)
        return beta_1, beta_2, beta_1**t, beta_2**t

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            raise ValueError("FusedAdam has no amsgrad")
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        beta_1, beta_2, power_1, power_2 = (tf.cast(b, dtype) for b in self.betas())
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].handle,
            v=self._velocities[index].handle,
            beta1_power=power_1,
            beta2_power=power_2,
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.constant(self.epsilon, dtype),
            # An embedding's IndexedSlices counts as its dense form: every row's
            # moments decay, as in T2T's Adam and as the train step hands its
            # gradients over (Keras's Adam would decay only the rows named).
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),
        )
