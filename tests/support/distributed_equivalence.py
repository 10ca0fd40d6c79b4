"""Run as a script (logical devices must exist before TensorFlow starts): exact
accumulation across replicas, against a reference computed by hand.

2 replicas × n=3 micro-batches × 4 updates under MirroredStrategy, through the
trainer's own `build_training`, must give the weights AND optimizer slots that plain
SGD / momentum formulas give on the same 24 uneven micro-batches:

    g(u) = Σ ∇(token loss sums of window u) / Σ tokens   [+ decay · w, clipped]
    sgd:      w ← w − lr(u) · g(u)
    momentum: v ← μ·v − lr(u) · g(u);  w ← w + v

lr(u) = constant · linear_decay(u) = 0.5 · (4 − u) / 4: distinct and non-zero at
every update, so a unit, scale or window-order bug cannot cancel. n ≠ replicas, so an
n/r mix-up cannot either. The reference never touches TrainStep, the accumulator or
the optimizer classes.

Communication is counted by a CrossDeviceOps that counts the reductions traced into
each compiled step (MirroredStrategy routes every all-reduce through it): the sgd
case's two functions are traced under the counter before they train (and must be
traced only that once), with a control that adds one all-reduce per micro-step and
must be seen.

A step that fails on one replica only (an error injected into replica 1's backward
pass) leaves replica 0's accumulators and noise-scale sums, and the counters, as they
were: a retry of the micro-batch must not count replica 0's share twice.

The momentum case runs once more under a simulated memory limit that makes
micro-batches split (training/step/out_of_memory.py): both replicas' shares halved alike,
some down to one sentence beside an empty share, and the same reference must hold.

Prints one JSON line.
"""

import json
import sys

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2,
)

from support.accumulation_helpers import VOCAB, tiny_hparams, uneven_micro_batches
from t2t_lite.models.losses import token_loss
from t2t_lite.training.opening.build import build_training
from t2t_lite.training.step.out_of_memory import SimulatedMemory
from t2t_lite.training.step.train_step import TrainStep

N, REPLICAS, UPDATES = 3, 2, 4
CONSTANT, MOMENTUM = 0.5, 0.9


class CountingReduction(tf.distribute.ReductionToOneDevice):
    """ReductionToOneDevice that counts the reductions traced: `groups` (one per
    all_reduce call, however many tensors it carries) and `tensors` (values
    reduced). A batch reduction reduces value by value inside; those are not
    counted again."""

    def __init__(self):
        super().__init__()
        self.groups = self.tensors = 0
        self._inside_batch = False

    def reduce_implementation(
        self, reduce_op, per_replica_value, destinations, options
    ):
        if not self._inside_batch:
            self.groups += 1
            self.tensors += 1
        return super().reduce_implementation(
            reduce_op, per_replica_value, destinations, options
        )

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        self.groups += 1
        self.tensors += len(value_destination_pairs)
        self._inside_batch = True
        try:
            return super().batch_reduce_implementation(
                reduce_op, value_destination_pairs, options
            )
        finally:
            self._inside_batch = False


def hparams(optimizer, **overrides):
    return tiny_hparams(
        optimizer=optimizer,
        optimizer_multistep_accumulate_steps=N,
        learning_rate_schedule="constant*linear_decay",
        learning_rate_constant=CONSTANT,
        learning_rate_decay_steps=UPDATES,
        optimizer_momentum_momentum=MOMENTUM,
        **overrides,
    )


def window(micro, u):
    """The micro-batches of update u: micro-step m, replica r gets index
    (u·n + m)·R + r."""
    return micro[u * N * REPLICAS : (u + 1) * N * REPLICAS]


# --- the reference, by hand -----------------------------------------------------------


def _is_bias(variable):
    name = variable.name.split("/")[-1].split(":")[0]
    return len(variable.shape) == 1 and name in ("bias", "beta")


class Reference:
    """The update rules above in numpy, on the gradients of a plain Keras model: its
    forward pass and token_loss under a GradientTape (one tf.function, traced once
    for every batch shape and reused by every case)."""

    def __init__(self):
        self.model = build_training(
            hparams("sgd"), vocab_size=VOCAB, train_steps=1
        ).model
        signature = {
            key: tf.TensorSpec([None, None], tf.int32) for key in ("inputs", "targets")
        }
        self.gradients = tf.function(self._gradients, input_signature=[signature])

    def _gradients(self, batch):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss_sum, count = token_loss(
                self.model(batch, training=True), batch["targets"], 0.1
            )
        grads = tape.gradient(loss_sum, variables)
        return [tf.convert_to_tensor(g) for g in grads], count

    def __call__(self, start, micro, optimizer, clip=0.0, decay=0.0):
        """(weights, momentum slots) after UPDATES updates."""
        self.model.set_weights(start)
        variables = self.model.trainable_variables
        weights = [v.numpy().astype(np.float64) for v in variables]
        velocity = [np.zeros_like(w) for w in weights]
        for u in range(UPDATES):
            for v, w in zip(variables, weights):
                v.assign(w.astype(np.float32))
            total = [np.zeros_like(w) for w in weights]
            tokens = 0.0
            for batch in window(micro, u):
                grads, count = self.gradients(
                    {k: tf.constant(b) for k, b in batch.items()}
                )
                for i, g in enumerate(grads):
                    total[i] += g.numpy()
                tokens += float(count)
            gradient = [t / tokens for t in total]
            if decay:
                gradient = [
                    g if _is_bias(v) else g + decay * w
                    for g, v, w in zip(gradient, variables, weights)
                ]
            norm = np.sqrt(sum(float(np.sum(g * g)) for g in gradient))
            if clip and norm > clip:
                gradient = [g * clip / norm for g in gradient]
            rate = CONSTANT * min(max((UPDATES - u) / UPDATES, 0.0), 1.0)
            if optimizer == "sgd":
                weights = [w - rate * g for w, g in zip(weights, gradient)]
            else:
                velocity = [MOMENTUM * v - rate * g for v, g in zip(velocity, gradient)]
                weights = [w + v for w, v in zip(weights, velocity)]
        return weights, velocity


# --- the distributed run ----------------------------------------------------------------


def distributed(strategy, start, optimizer, step_class=TrainStep, **overrides):
    """A run built by build_training under `strategy` from the weights `start`."""
    run = build_training(
        hparams(optimizer, **overrides),
        vocab_size=VOCAB,
        train_steps=N * UPDATES,
        strategy=strategy,
        initial_weights=start,
    )
    if step_class is not TrainStep:  # the control: same run, another step class
        run.step = step_class(
            run.model,
            run.optimizer,
            accumulate_steps=N,
            label_smoothing=0.1,
            strategy=strategy,
        )
    return run


def train(strategy, run, micro):
    """Feeds `micro` to the run's step, REPLICAS micro-batches per micro-step."""
    for micro_step in range(len(micro) // REPLICAS):
        pair = micro[micro_step * REPLICAS : (micro_step + 1) * REPLICAS]
        run.step.train_on(
            distribute(strategy, pair), run.step.is_update_micro_step(micro_step)
        )
    return run


def distribute(strategy, batches):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: {
            k: tf.constant(v) for k, v in batches[ctx.replica_id_in_sync_group].items()
        }
    )


def longest_pair(micro):
    """Source plus target tokens of the longest sentence pair in `micro`."""
    return max(
        int(np.sum(b["inputs"][row] > 0) + np.sum(b["targets"][row] > 0))
        for b in micro
        for row in range(len(b["inputs"]))
    )


def ratio(actual, expected, rtol=1e-5, atol=1e-7):
    """max |a − e| / (rtol·|e| + atol); < 1 means equal."""
    return max(
        float(np.max(np.abs(a - e) / (rtol * np.abs(e) + atol)))
        for a, e in zip(actual, expected)
    )


def momentum_slots(run):
    """The optimizer's momentum slots, in trainable-variable order."""
    slots = run.optimizer.momentums
    return [tf.convert_to_tensor(s).numpy() for s in slots]


def traced_groups(counter, function, batch):
    """All-reduce groups traced into `function` (not yet traced) for `batch`."""
    counter.groups = counter.tensors = 0
    function.get_concrete_function(batch)
    return counter.groups, counter.tensors


class ChattyStep(TrainStep):
    """The control: an extra all-reduce on every accumulate micro-step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        quiet = self.replica.accumulate

        def accumulate(batch):
            out = quiet(batch)
            context = tf.distribute.get_replica_context()
            out["loss_sum"] = context.all_reduce(
                tf.distribute.ReduceOp.SUM, out["loss_sum"]
            )
            return out

        self.replica.accumulate = accumulate
        self.recompile()


def one_replica_fails(strategy, micro):
    """Whether a step failing on replica 1 alone left every replica's state as it
    was, for an accumulate and an update micro-step."""
    run = build_training(
        hparams("momentum"),
        vocab_size=VOCAB,
        train_steps=8,
        strategy=strategy,
    )
    step, original, fail = run.step, run.step._gradients, tf.Variable(False)

    def failing_gradients(batch):
        gradients, loss_sum, tokens = original(batch)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group

        def check(flag, replica, _):
            if flag and replica == 1:
                raise ValueError("injected failure on replica 1")
            return flag

        ok = tf.numpy_function(check, [fail, replica, loss_sum], tf.bool)
        with tf.control_dependencies([ok]):
            return gradients, loss_sum, tf.identity(tokens)

    step._gradients = failing_gradients
    step.recompile()
    step.train_on(distribute(strategy, micro[:REPLICAS]), False)

    def state():
        values = [step.accumulator.tokens, *step.noise_scale._sums()]
        local = [strategy.experimental_local_results(v) for v in values]
        return [float(t) for results in local for t in results] + [step.micro_step]

    before = state()
    fail.assign(True)
    unchanged = []
    for closes in (False, True):
        try:
            step.train_on(distribute(strategy, micro[REPLICAS : 2 * REPLICAS]), closes)
            unchanged.append(False)  # it should have failed
        except tf.errors.OpError:
            unchanged.append(state() == before)
    return unchanged


def main():
    micro = uneven_micro_batches(N * REPLICAS * UPDATES, seed=3)
    counter = CountingReduction()
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=counter
    )
    tf.keras.utils.set_random_seed(20261130)
    start = build_training(
        hparams("sgd"), vocab_size=VOCAB, train_steps=1
    ).model.get_weights()
    reference = Reference()
    batch = distribute(strategy, micro[:REPLICAS])
    report = {}
    cases = {
        "sgd": ("sgd", {}),
        "momentum": ("momentum", {}),
        "momentum_clip_decay": (
            "momentum",
            {"clip_grad_norm": 0.05, "weight_decay": 0.1},
        ),
    }
    cases["momentum_split"] = ("momentum", {})
    for name, (optimizer, knobs) in cases.items():
        run = distributed(strategy, start, optimizer, **knobs)
        if name == "momentum_split":
            # Room for the longest sentence pair alone, and so for no micro-batch
            # of the longer ones: these are split, some more than once.
            run.step.simulated_memory = SimulatedMemory(longest_pair(micro))
        if name == "sgd":  # its two functions, traced here by the counter, then run
            report["accumulate_groups"], _ = traced_groups(
                counter, run.step.accumulate, batch
            )
            report["update_groups"], report["update_tensors"] = traced_groups(
                counter, run.step.accumulate_and_update, batch
            )
        train(strategy, run, micro)
        weights, velocity = reference(
            start,
            micro,
            optimizer,
            clip=knobs.get("clip_grad_norm", 0.0),
            decay=knobs.get("weight_decay", 0.0),
        )
        report[f"{name}_weights_ratio"] = ratio(run.model.get_weights(), weights)
        report[f"{name}_moved_ratio"] = ratio(run.model.get_weights(), start)
        if optimizer == "momentum":
            report[f"{name}_slots_ratio"] = ratio(momentum_slots(run), velocity)
        report[f"{name}_updates"] = run.step.update_step
        report[f"{name}_micro_steps"] = run.step.micro_step
        report[f"{name}_tracing_counts"] = [
            run.step.accumulate.experimental_get_tracing_count(),
            run.step.accumulate_and_update.experimental_get_tracing_count(),
        ]
    report["splits"] = int(tf.convert_to_tensor(run.step.oom_splits))
    report["part_groups"], _ = traced_groups(
        counter, distributed(strategy, start, "sgd").step.accumulate_part, batch
    )
    report["variables"] = len(run.model.trainable_variables)
    chatty = distributed(strategy, start, "sgd", ChattyStep)  # traced only
    report["control_accumulate_groups"], _ = traced_groups(
        counter, chatty.step.accumulate, batch
    )
    report["one_replica_fails_unchanged"] = one_replica_fails(strategy, micro)
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
