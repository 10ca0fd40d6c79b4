"""Run as a script (logical devices must exist before TensorFlow starts): a
batch-size ramp on 2 replicas against the hand-written reference of
tests/support/window_reference.py.

The ramp in tokens over both replicas gives windows of 1, 1, 2, 2, 4, 4 micro-steps;
every micro-step feeds each replica its own uneven micro-batch, so update u's window
holds 2·n(u) micro-batches, and the reference takes them as one big batch. Momentum:
weights and slots must match. The noise scale is measured on the way (each replica's
micro-batches are the small batches), and must be finite and positive.

Adam, with both betas at a fixed half-life in tokens (optim/token_adam.py): weights and
both moments must match Adam by hand with the betas of the windows' tokens over both
replicas. Its betas are read from the run's batch clock once per update on each
replica's device (optim/fused.py); the update's graph must hold one set per device.

Prints one JSON line.
"""

import json

import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2,
)

from support.accumulation_helpers import VOCAB, uneven_micro_batches
from support.window_reference import (
    BETA_1,
    BETA_2,
    CONSTANT,
    DECAY,
    MICRO,
    RAMP,
    Reference,
    drive,
    hand_betas,
    hparams,
    ratio,
    split_into_windows,
    start_weights,
)
from t2t_lite.training.opening.build import build_training

REPLICAS = 2
WINDOWS = [1, 1, 2, 2, 4, 4]


def ramp_case(strategy, reference, start, micro, hp, optimizer, **hand):
    """The ramp on both replicas against the reference (`hand`: its rate_of and
    betas_of): sizes, updates, ratios of weights and slots (momentum: [velocity];
    adam: [m, v])."""
    run = build_training(
        hp,
        vocab_size=VOCAB,
        train_steps=sum(WINDOWS),
        strategy=strategy,
        initial_weights=start,
    )
    pairs = [
        strategy.experimental_distribute_values_from_function(
            lambda ctx, i=i: {
                k: tf.constant(v)
                for k, v in micro[REPLICAS * i + ctx.replica_id_in_sync_group].items()
            }
        )
        for i in range(sum(WINDOWS))
    ]
    sizes = drive(run.step, pairs)
    weights, slots = reference(
        start,
        split_into_windows(micro, [REPLICAS * n for n in WINDOWS]),
        optimizer,
        total_updates=len(WINDOWS),
        **hand,
    )
    if optimizer == "adam":
        actual = [run.optimizer._momentums, run.optimizer._velocities]
    else:
        actual, slots = [run.optimizer.momentums], [slots]
    return (
        run,
        pairs[0],
        {
            "sizes": sizes,
            "updates": run.step.update_step,
            "weights_ratio": ratio(
                [v.numpy() for v in run.model.trainable_variables], weights
            ),
            "slots_ratios": [
                ratio([tf.convert_to_tensor(s).numpy() for s in mine], hand)
                for mine, hand in zip(actual, slots)
            ],
        },
    )


def pow_ops(function, batch):
    """Pow ops in `function`'s graph for `batch`, with those of the functions it
    calls (cond branches)."""
    graph = function.get_concrete_function(batch).graph.as_graph_def()
    nodes = list(graph.node)
    for called in graph.library.function:
        nodes.extend(called.node_def)
    return sum(node.op == "Pow" for node in nodes)


def main():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    hp = hparams("momentum", schedule=RAMP, replicas=REPLICAS)
    start = list(start_weights())
    micro = uneven_micro_batches(REPLICAS * sum(WINDOWS), seed=5)
    reference = Reference(hp)
    run, _, report = ramp_case(strategy, reference, start, micro, hp, "momentum")
    report["noise_scale"] = run.step.noise_scale_value()
    tokens = 2 * MICRO * REPLICAS  # windows of 1 micro-step: β ** 0.5; of 4: β ** 2
    # A tenth of the momentum case's rate: Adam's steps are ~rate whatever the
    # gradient, and float32 sums in another order would otherwise move them by
    # close to the tolerance.
    rate = CONSTANT / 10
    adam = hparams(
        "adam",
        schedule=RAMP,
        replicas=REPLICAS,
        optimizer_adam_beta1=BETA_1,
        optimizer_adam_beta2=BETA_2,
        adam_beta_tokens_reference=tokens,
        adam_beta1_follows_tokens=True,
    ).override(learning_rate_constant=rate)
    betas = hand_betas(tokens, True, micro_tokens=MICRO * REPLICAS)
    run, batch, report["adam"] = ramp_case(
        strategy,
        reference,
        start,
        micro,
        adam,
        "adam",
        rate_of=lambda u: rate * (len(WINDOWS) - u) / DECAY,
        betas_of=lambda u: betas[u],
    )
    report["adam"]["update_pow_ops"] = pow_ops(run.step.accumulate_and_update, batch)
    report["adam"]["variables"] = len(run.model.trainable_variables)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
