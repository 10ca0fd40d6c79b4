"""Run as a script (logical devices must exist before TensorFlow starts): a
batch-size ramp on 2 replicas against the hand-written reference of
tests/support/window_reference.py.

The ramp in tokens over both replicas gives windows of 1, 1, 2, 2, 4, 4 micro-steps;
every micro-step feeds each replica its own uneven micro-batch, so update u's window
holds 2·n(u) micro-batches, and the reference takes them as one big batch. Momentum:
weights and slots must match. The noise scale is measured on the way (each replica's
micro-batches are the small batches), and must be finite and positive.

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
    RAMP,
    Reference,
    drive,
    hparams,
    ratio,
    split_into_windows,
)
from t2t_lite.training.opening.build import build_training

REPLICAS = 2
WINDOWS = [1, 1, 2, 2, 4, 4]


def main():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    hp = hparams("momentum", schedule=RAMP, replicas=REPLICAS)
    start = build_training(hp, vocab_size=VOCAB, train_steps=1).model.get_weights()
    micro = uneven_micro_batches(REPLICAS * sum(WINDOWS), seed=5)
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
    weights, velocity = Reference(hp)(
        start,
        split_into_windows(micro, [REPLICAS * n for n in WINDOWS]),
        "momentum",
        total_updates=len(WINDOWS),
    )
    slots = [tf.convert_to_tensor(s).numpy() for s in run.optimizer.momentums]
    print(
        json.dumps(
            {
                "sizes": sizes,
                "updates": run.step.update_step,
                "weights_ratio": ratio(
                    [v.numpy() for v in run.model.trainable_variables], weights
                ),
                "slots_ratio": ratio(slots, velocity),
                "noise_scale": run.step.noise_scale_value(),
            }
        )
    )


if __name__ == "__main__":
    main()
