"""Adafactor with its second moments factored, as T2T and the paper keep them.

Adafactor (Shazeer and Stern, 2018) is chosen for its memory: for a matrix it keeps
the running means of the squared gradient's rows (r) and columns (c) only, and
estimates the second moments as (r / mean(r)) ⊗ c when it updates. Keras 3's
Adafactor computes that estimate, then stores it in a slot as large as the matrix,
and the next update overwrites the slot without reading it. Its state is then as
large as the weights (Adam's is twice): on transformer_base 184 MiB, against 0.8 MiB
here (docs/benchmarks.md, "Adafactor"). This class keeps r and c for every variable
of two or more dimensions (its last two factored, as Keras does) and a full slot
only for vectors, as T2T's AdafactorOptimizer does.

The formulas are Keras's (the relative step min(rate, 1/√t), the decay 1 - t^-0.8,
the parameter scale max(ε2, RMS(w)), update clipping by RMS), so results agree with
keras.optimizers.Adafactor to float rounding. With relative_step=False the step is
the rate the schedule gives, uncapped, as in T2T's AdafactorOptimizer given a
learning rate (and fairseq's relative_step=False); Keras caps it at 1/√t even then.
The cap binds once t > 1/rate², so a constant rate of 0.05 becomes 1/√t decay after
400 updates. The estimate is applied as T2T applies it, as row and column factors
of the gradient, without forming the full-size tensor. The scalars every
variable's update takes are built once per apply() (OncePerApply).

A checkpoint names each slot as Keras's Adafactor does, by its place in Keras's
flat list of optimizer variables (r, c and v of every variable in turn); the
places of the slots this class does not keep hold a scalar. So a run written with
Keras's Adafactor resumes here exactly: its r, c and vectors' v are restored, and
its full-size slots are read and dropped.
"""

import keras
import tensorflow as tf

from t2t_lite.optim.fused import OncePerApply, Untracked


def _rms(x):
    return tf.sqrt(tf.reduce_mean(tf.square(x)))


class _Indexed(tf.__internal__.tracking.Trackable):
    """Checkpoint children named by position: "0", "1", ..."""

    def __init__(self, slots):
        self._slots = slots

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        del save_type, kwargs
        return {str(k): slot for k, slot in enumerate(self._slots)}


class _Unread(tf.__internal__.tracking.Trackable):
    """A place of Keras's layout where this class keeps no slot (a matrix's full
    slot, a vector's scalar placeholders). Restoring, it takes the value there and
    drops it, so that a checkpoint of Keras's Adafactor restores with no value
    left over (TensorFlow warns of each one); it saves a scalar zero of the dtype
    Keras's variable there has."""

    def __init__(self, dtype):
        self._dtype = dtype

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": tf.zeros([], self._dtype)}

    def _restore_from_tensors(self, restored_tensors):
        del restored_tensors


class FactoredAdafactor(OncePerApply, keras.optimizers.Adafactor):
    """keras.optimizers.Adafactor without the full-size slot of a matrix."""

    def build(self, var_list):
        if self.built:
            return
        keras.optimizers.Optimizer.build(self, var_list)  # not Adafactor's slots
        # Keras's Adafactor adds r, c and v for every variable in turn (int32
        # scalar placeholders for a vector's r and c, a full-size v for a matrix).
        layout, r, c, v = list(self._variables), [], [], []
        for var in var_list:
            if self._overwrite_variable_with_gradient(var):
                slots = (None, None, None)
            elif len(var.shape) >= 2:
                rows, columns = var.shape[:-1], var.shape[:-2] + (var.shape[-1],)
                slots = (
                    self.add_variable(rows, dtype=var.dtype, name=var.name),
                    self.add_variable(columns, dtype=var.dtype, name=var.name),
                    None,
                )
                layout.extend((*slots[:2], _Unread(var.dtype)))
            else:
                velocity = self.add_variable_from_reference(var, name="velocity")
                slots = (None, None, velocity)
                layout.extend((_Unread(tf.int32), _Unread(tf.int32), velocity))
            for slot_list, slot in zip((r, c, v), slots):
                slot_list.append(slot)
        self._r, self._c, self._v = r, c, v
        # One object for every call of _trackable_children: a save looks it up.
        indexed = _Indexed(layout)
        self._keras_layout = Untracked(indexed)
        # A checkpoint restored before this build left its slots waiting.
        self._handle_deferred_dependencies(name="_variables", trackable=indexed)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """The slots under the names Keras's Adafactor gives them (module
        docstring). Before build there are none: a restore then leaves them
        waiting for build, rather than for Keras's own list, whose places differ."""
        children = super()._trackable_children(save_type, **kwargs)
        for name in ("_r", "_c", "_v", "_variables"):
            children.pop(name, None)
        if self.built:
            children["_variables"] = self._keras_layout.value
        return children

    def _step_scalars(self, learning_rate, dtype):
        """(step size ρ, decay β2, ε2, ε1) of the update being applied."""
        step = tf.cast(self.iterations + 1, dtype)
        rate = tf.cast(learning_rate, dtype)
        if self.relative_step:
            rate = tf.minimum(rate, tf.math.rsqrt(step))
        decay = 1 - tf.pow(step, tf.cast(self.beta_2_decay, dtype))
        return (
            rate,
            decay,
            tf.constant(self.epsilon_2, dtype),
            tf.constant(self.epsilon_1, dtype),
        )

    def update_step(self, gradient, variable, learning_rate):
        rate, decay, epsilon_2, epsilon_1 = self.shared(
            variable, lambda dtype: self._step_scalars(learning_rate, dtype)
        )
        index = self._get_variable_index(variable)
        gradient = tf.cast(tf.convert_to_tensor(gradient), variable.dtype)
        squared = tf.square(gradient)
        velocity = self._v[index]
        # An update's cost is its passes over the variable's memory, so ε1 is
        # added to a matrix's means (the mean of g² + ε1 is theirs plus ε1), and
        # the clipping and the parameter scale multiply the update once, together.
        if velocity is None:
            rows, columns = self._r[index], self._c[index]
            row_mean = tf.reduce_mean(squared, -1) + epsilon_1
            column_mean = tf.reduce_mean(squared, -2) + epsilon_1
            rows.assign(decay * rows + (1 - decay) * row_mean)
            columns.assign(decay * columns + (1 - decay) * column_mean)
            row_factor = tf.math.rsqrt(rows / tf.reduce_mean(rows, -1, keepdims=True))
            column_factor = tf.math.rsqrt(columns)
            update = gradient * row_factor[..., None] * column_factor[..., None, :]
        else:
            velocity.assign(decay * velocity + (1 - decay) * (squared + epsilon_1))
            update = gradient * tf.math.rsqrt(velocity)
        clipping = tf.maximum(1.0, _rms(update) / self.clip_threshold)
        scale = tf.maximum(epsilon_2, _rms(variable)) * rate / clipping
        variable.assign_sub(scale * update)
