"""Keras's Adam and SGD whose update of a variable is one kernel of TensorFlow's.

Keras 3 writes an optimizer's update as element-wise ops per variable (Adam: a dozen,
for m, v, the bias corrections and the step), each a pass over the variable's memory
and, in a traced step, some forty graph ops to build and optimize. TensorFlow's fused
kernels do the same arithmetic in one pass: ApplyAdam (tf.train.AdamOptimizer's,
hence T2T's), ApplyKerasMomentum and ApplyGradientDescent (Keras 2's SGD). On
transformer_base's weights on a CPU, Adam applies an update in about 0.45× the time,
and its update traces and compiles in about a sixth of Keras's time
(docs/benchmarks.md, "Fused updates"). The formulas are Keras's, so results agree to
float rounding, and the slots are Keras's variables: checkpoints are the same
either way.

An embedding's IndexedSlices gradient counts as its dense form (every row's moments
decay, as in T2T and as the train step hands its gradients over); Keras 3's own
optimizers would update only the rows it names.

Keras calls update_step once per variable, so scalars every variable's kernel takes
(Adam's betas, their powers, ε) would be built once per variable: on transformer_base
half of the update's graph. FusedAdam builds them once per apply() instead.
"""

import keras
import tensorflow as tf


def _dense(gradient, dtype):
    return tf.cast(tf.convert_to_tensor(gradient), dtype)


class Untracked:
    """Holds a value out of Keras's sight: Keras tracks a dict, list or trackable
    attribute of an optimizer and saves it in checkpoints under its name."""

    def __init__(self, value=None):
        self.value = value


class OncePerApply:
    """A mixin for a Keras optimizer whose update steps share scalars (betas, their
    powers, a step size): `shared(variable, build)` returns `build(dtype)` built by
    the first update step of an apply() on the variable's device and reused by the
    others there. They are the same for every variable: the update count moves only
    once all are updated. Keyed by graph too, since a cond branch inside an apply is
    a graph of its own; an update_step called outside apply() builds its own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._per_apply = Untracked()  # the scalars of the apply() under way

    def apply(self, grads, trainable_variables=None):
        self._per_apply.value = {}
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._per_apply.value = None

    def shared(self, variable, build):
        cache = self._per_apply.value
        if cache is None:
            cache = {}
        key = (tf.compat.v1.get_default_graph(), variable.device, variable.dtype)
        if key not in cache:
            cache[key] = build(variable.dtype)
        return cache[key]


class FusedAdam(OncePerApply, keras.optimizers.Adam):
    """keras.optimizers.Adam (without amsgrad) through TensorFlow's ApplyAdam."""

    def betas(self):
        """(β1, β2, β1^t, β2^t) of the update being applied (t counts from 1),
        float32 tensors; subclasses change how the betas move."""
        t = tf.cast(self.iterations + 1, tf.float32)
        beta_1 = tf.constant(self.beta_1, tf.float32)
        beta_2 = tf.constant(self.beta_2, tf.float32)
        return beta_1, beta_2, beta_1**t, beta_2**t

    def _kernel_scalars(self, dtype):
        """(β1, β2, β1^t, β2^t, ε) in `dtype`."""
        betas = tuple(tf.cast(b, dtype) for b in self.betas())
        return betas + (tf.constant(self.epsilon, dtype),)

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            raise ValueError("FusedAdam has no amsgrad")
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        beta_1, beta_2, power_1, power_2, epsilon = self.shared(
            variable, self._kernel_scalars
        )
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].handle,
            v=self._velocities[index].handle,
            beta1_power=power_1,
            beta2_power=power_2,
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=epsilon,
            grad=_dense(gradient, dtype),
        )


class FusedSGD(keras.optimizers.SGD):
    """keras.optimizers.SGD (plain, momentum or Nesterov) through TensorFlow's
    ApplyGradientDescent / ApplyKerasMomentum."""

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        rate, gradient = tf.cast(learning_rate, dtype), _dense(gradient, dtype)
        if self.momentum == 0:
            tf.raw_ops.ResourceApplyGradientDescent(
                var=variable.handle, alpha=rate, delta=gradient
            )
            return
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=variable.handle,
            accum=self.momentums[self._get_variable_index(variable)].handle,
            lr=rate,
            grad=gradient,
            momentum=tf.constant(self.momentum, dtype),
            use_nesterov=self.nesterov,
        )
