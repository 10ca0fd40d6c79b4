"""Activation recomputation: a layer's activations are recomputed in the backward
pass instead of being kept from the forward pass (hparam `recompute_grad`).

Only the layer's inputs stay alive between the forward and the backward pass; each
layer's intermediate activations (attention weights, the feed-forward's filter-wide
hidden layer, dropout masks, layer-norm statistics) exist only while that one layer
is computed, once forward and once again backward. This trades one more forward
pass per layer for the activation memory of all but one layer.

Why not `tf.recompute_grad` (or Keras's `remat`, which is it on TensorFlow):
dropout draws its masks from the layer's `keras.random.SeedGenerator`, a variable
that advances on every draw. Run again in the backward pass, the layer would draw
new masks (the gradient would belong to another forward pass than the one whose loss
was computed) and advance the generator a second time (a resumed run would then draw
other masks than an uninterrupted one). Here the generators' states are read before
the forward pass and put back before the recomputation, so it draws the very masks
the forward pass drew and leaves every generator where the forward pass left it:
gradients with and without recomputation are equal (tests/test_recompute.py).

The recomputation waits for the gradient flowing into the layer (a control
dependency), so it runs during the backward pass, when the memory of the layers
above has been released, and the graph optimizer cannot merge it with the forward
computation it repeats.
"""

import keras
import tensorflow as tf


def seed_generators(layer):
    """Every keras.random.SeedGenerator of `layer` and its sublayers, in a fixed
    order."""
    found, seen = [], set()

    def visit(obj):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        for value in vars(obj).values():
            if isinstance(value, keras.random.SeedGenerator):
                if id(value) not in seen:
                    seen.add(id(value))
                    found.append(value)
            elif isinstance(value, keras.layers.Layer):
                visit(value)

    visit(layer)
    return found


def recomputed(layer, fn, *inputs):
    """fn(*inputs) -> one float tensor, with `layer`'s activations recomputed in
    the backward pass.

    inputs: the float tensors the gradient flows to (e.g. the layer's input and, in
    a decoder layer, the encoder output); everything else `fn` needs (attention
    biases, `training`) it closes over. Gradients reach `inputs` and `layer`'s
    trainable variables, as if fn(*inputs) had been called directly.
    """
    generators = seed_generators(layer)

    @tf.custom_gradient
    def forward(*inputs):
        # Copies (`* 1`), not reads that could see the forward pass's draws.
        starts = [generator.state.value * 1 for generator in generators]
        output = fn(*inputs)

        def backward(upstream, variables=None):
            variables = list(variables or [])
            with tf.control_dependencies([upstream]):
                # Keras's assign returns the assigned value, a tensor.
                rewound = [
                    generator.state.assign(start)
                    for generator, start in zip(generators, starts)
                ]
            with (
                tf.control_dependencies([upstream, *rewound]),
                tf.GradientTape() as tape,
            ):
                tape.watch(inputs)
                again = fn(*[tf.identity(x) for x in inputs])
            gradients = tape.gradient(
                again,
                list(inputs) + variables,
                output_gradients=upstream,
                unconnected_gradients=tf.UnconnectedGradients.NONE,
            )
            return gradients[: len(inputs)], gradients[len(inputs) :]

        return output, backward

    return forward(*inputs)
