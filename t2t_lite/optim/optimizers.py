"""Registered optimizers: a name → a function (hp, learning_rate) → Keras optimizer.

The Keras optimizers are used for their update rules only; Adam, SGD and momentum
apply them with one TensorFlow kernel per variable (optim/fused.py), and Adafactor
keeps a matrix's second moments factored (optim/adafactor.py). Gradient normalization,
weight decay and clipping are done by t2t_lite once per update on the accumulated
gradient (see training/step/train_step.py), so none of Keras's `global_clipnorm`,
`weight_decay` or `gradient_accumulation_steps` options is ever turned on: Keras's
built-in accumulation evaluates schedules on micro-steps and averages micro-batch
means, which is not what docs/design.md §2 asks for.

`multistep_adam` is Adam: the "multistep" part is the accumulation the train step
applies whenever optimizer_multistep_accumulate_steps > 1, for any optimizer.
"""

from t2t_lite.optim.adafactor import FactoredAdafactor
from t2t_lite.optim.fused import FusedAdam, FusedSGD
from t2t_lite.registry import OPTIMIZERS


@OPTIMIZERS.register("adam")
def adam(hp, learning_rate):
    return FusedAdam(
        learning_rate=learning_rate,
        beta_1=hp.optimizer_adam_beta1,
        beta_2=hp.optimizer_adam_beta2,
        epsilon=hp.optimizer_adam_epsilon,
    )


OPTIMIZERS.add("multistep_adam", adam)


@OPTIMIZERS.register("sgd")
def sgd(hp, learning_rate):
    del hp
    return FusedSGD(learning_rate=learning_rate)


@OPTIMIZERS.register("momentum")
def momentum(hp, learning_rate):
    return FusedSGD(
        learning_rate=learning_rate,
        momentum=hp.optimizer_momentum_momentum,
        nesterov=hp.optimizer_momentum_nesterov,
    )


@OPTIMIZERS.register("adafactor")
def adafactor(hp, learning_rate):
    return FactoredAdafactor(
        learning_rate=learning_rate,
        beta_2_decay=-hp.optimizer_adafactor_decay_rate,
        clip_threshold=hp.optimizer_adafactor_clipping_threshold,
        relative_step=hp.optimizer_adafactor_relative_step,
    )


def optimizer_from_hparams(hp, learning_rate):
    """The registered optimizer named by hp.optimizer (unknown names: RegistryError)."""
    return OPTIMIZERS.get(hp.optimizer)(hp, learning_rate)


def skip_keras_all_reduce(optimizer):
    """Keras 3's TF optimizers all-reduce gradients inside `apply` when called in a
    replica context. TrainStep._update has already summed gradients and token counts across
    replicas in ONE all-reduce (the counts must be summed before normalizing, and the
    clip norm needs the summed gradient), so a second reduction would multiply the
    update by the number of replicas. Keras has no public switch; this replaces the
    private hook on this instance only. The MirroredStrategy equivalence test fails
    if a Keras release renames it."""
    if not hasattr(optimizer, "_all_reduce_sum_gradients"):
        raise RuntimeError(
            "This Keras version has no Optimizer._all_reduce_sum_gradients;"
            " t2t_lite's single all-reduce per update needs updating."
        )
    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars
