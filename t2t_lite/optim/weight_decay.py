"""T2T's L2 weight decay, applied once per update to the normalized gradient
(docs/design.md §2.2), and the rule for what it skips."""

import tensorflow as tf

_BIAS_NAMES = ("bias", "beta")  # Dense bias; Keras's name for a layer-norm bias


def is_bias(variable):
    """T2T's rule for what weight decay skips: rank-1 variables named like a bias.
    Layer-norm scales (Keras's "gamma", T2T's "layer_norm_scale") ARE decayed."""
    name = variable.name.split("/")[-1].split(":")[0]
    return len(variable.shape) == 1 and name in _BIAS_NAMES


def add_weight_decay(gradient, variable, rate):
    """T2T's L2 weight decay (gradient of rate · ||v||² / 2) on every variable but
    biases, added once per update to the normalized gradient."""
    if is_bias(variable):
        return gradient
    return gradient + rate * tf.convert_to_tensor(variable)
