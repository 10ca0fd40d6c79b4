"""Building a registered model with its variables created, the one way everyone does.

Keras creates variables on the first call; a checkpoint can only be restored, and an
optimizer only built, once they exist. Trainer, decoder, tests and benchmarks all go
through `build_model`, so none of them invents its own dummy batch.
"""

import tensorflow as tf

from t2t_lite.graph import releasing_custom_gradients


def example_features():
    """The smallest valid feature dict: one sequence of two ids on each side."""
    return {"inputs": tf.ones([1, 2], tf.int32), "targets": tf.ones([1, 2], tf.int32)}


def build_model(model_class, hp, vocab_size):
    """`model_class.from_hparams(hp, vocab_size)` with its variables created.
    The Transformer's build() creates them from its config; Keras builds a layer
    without a build() of its own (a user's model may have one) by tracing it in a
    scratch graph, which the custom-gradient registry would keep alive
    (t2t_lite/graph.py)."""
    model = model_class.from_hparams(hp, vocab_size)
    with releasing_custom_gradients():
        model(example_features(), training=False)
    return model
