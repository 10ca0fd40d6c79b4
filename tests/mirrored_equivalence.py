"""Run as a script (logical devices must be set before TensorFlow starts):
2 replicas × n=2 accumulation under MirroredStrategy vs one big batch on one device.

Prints one JSON line: {"adam_ratio", "momentum_ratio", "double_reduce_ratio",
"updates", "micro_steps"}.
"""

import json
import re
import sys

import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2,
)

from accumulation_helpers import (  # noqa: E402
    VOCAB,
    build,
    concatenate,
    tiny_hparams,
    tolerance_ratio,
    uneven_micro_batches,
)
from t2t_lite.models.transformer import Transformer  # noqa: E402
from t2t_lite.optim.optimizers import optimizer_from_hparams  # noqa: E402
from t2t_lite.optim.schedule import schedule_from_hparams  # noqa: E402
from t2t_lite.training.train_step import TrainStep  # noqa: E402

N, REPLICAS, UPDATES = 2, 2, 2


def mirrored_run(strategy, start, micro, optimizer_name, keep_keras_all_reduce=False):
    hp = tiny_hparams(optimizer=optimizer_name, optimizer_multistep_accumulate_steps=N)
    with strategy.scope():
        model = Transformer.from_hparams(hp, VOCAB)
        model(
            {"inputs": tf.ones([1, 2], tf.int32), "targets": tf.ones([1, 2], tf.int32)}
        )
        model.set_weights(start)
        optimizer = optimizer_from_hparams(hp, schedule_from_hparams(hp, N * UPDATES))
        step = TrainStep(
            model,
            optimizer,
            accumulate_steps=N,
            label_smoothing=hp.label_smoothing,
            strategy=strategy,
        )
    if keep_keras_all_reduce:  # the bug the skip prevents: reducing twice
        del optimizer._all_reduce_sum_gradients
    for micro_step in range(N * UPDATES):
        pair = micro[micro_step * REPLICAS : (micro_step + 1) * REPLICAS]
        batch = strategy.experimental_distribute_values_from_function(
            lambda ctx, pair=pair: {
                k: tf.constant(v) for k, v in pair[ctx.replica_id_in_sync_group].items()
            }
        )
        step(batch, micro_step)
    return model, step, batch


def cross_device_ops(function, batch):
    """Ops of the traced function whose inputs come from more than one device:
    the places where replicas talk to each other."""
    graph = function.get_concrete_function(batch).graph
    return [
        op.type
        for op in graph.get_operations()
        if len({_device(i.op.device) for i in op.inputs} - {None}) > 1
    ]


def _device(name):
    match = re.search(r"CPU:(\d+)", name or "")
    return match.group(1) if match else None


def big_batch_run(micro, optimizer_name):
    per_update = N * REPLICAS
    model, step = build(tiny_hparams(optimizer=optimizer_name), UPDATES)
    start = model.get_weights()
    for u in range(UPDATES):
        step(
            {
                k: tf.constant(v)
                for k, v in concatenate(
                    micro[u * per_update : (u + 1) * per_update]
                ).items()
            },
            u,
        )
    return model, start


def main():
    micro = uneven_micro_batches(N * REPLICAS * UPDATES)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {}
    for name in ("adam", "momentum"):
        big, start = big_batch_run(micro, name)
        model, step, batch = mirrored_run(strategy, start, micro, name)
        report[f"{name}_ratio"] = tolerance_ratio(model, big)
        report.update(updates=step.update_step, micro_steps=step.micro_step)
    report["accumulate_cross_device_ops"] = len(
        cross_device_ops(step.accumulate, batch)
    )
    report["update_cross_device_ops"] = len(
        cross_device_ops(step.accumulate_and_update, batch)
    )
    # Momentum SGD is not scale-invariant (Adam nearly is), so it exposes a second
    # all-reduce, which would double every update.
    doubled, _, _ = mirrored_run(
        strategy, start, micro, "momentum", keep_keras_all_reduce=True
    )
    report["double_reduce_ratio"] = tolerance_ratio(doubled, big)
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
