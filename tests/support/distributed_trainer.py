"""Run as a script: the Trainer on 2 logical CPUs (MirroredStrategy).

  resume      A run stopped mid-window (micro-step 4 of n=3 windows) and resumed
              equals an uninterrupted one: weights, optimizer slots, accumulators
              and both replicas' data positions survive the checkpoint.
  replicas    A 1-replica checkpoint resumes on 2 replicas and a 2-replica one (a
              copy of resume's uninterrupted run) on 1, each with a warning naming
              old and new tokens per update.
  dropout     With dropout on (the 2-replica run of replicas), the two replicas
              draw different masks for the same batch.
  effective   effective_batch_size=192 with batch_size 64: n=3 on one replica; the
              same run refuses to resume on 2 replicas (n would become 2).
  save        The stopped run's checkpoint (its accumulators hold a partial window)
              holds what TF writes when it reads each replica-local variable
              itself, and a save asks for two reductions, not three per variable.

Prints one JSON line.
"""

import json
import logging as std_logging
import os
import shutil
import signal
import sys

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2,
)

import t2t_lite  # noqa: F401
from t2t_lite.errors import UserError
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.outputs.checkpoints import CheckpointKeeper
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions

N = 3


def hparams(**overrides):
    """Momentum SGD: a slot per variable, so a resume must restore slots too (it
    traces in about 2/3 of Adam's time under MirroredStrategy); no dropout unless
    asked for."""
    values = {
        "batch_size": 64,
        "max_length": 16,
        "optimizer": "momentum",
        "optimizer_multistep_accumulate_steps": N,
        "layer_prepostprocess_dropout": 0.0,
        "attention_dropout": 0.0,
        "relu_dropout": 0.0,
        "learning_rate_schedule": "constant*linear_decay",
        "learning_rate_constant": 0.05,
        "learning_rate_decay_steps": 3,
    }
    values.update(overrides)
    return transformer_test().override(**values)


class StopAt:
    """A callback that sends this process SIGTERM after micro-step `step`: the
    trainer saves that very step and returns, as on a pre-emption."""

    def __init__(self, step):
        self.step = step

    def on_step(self, step, seconds):
        if step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def trainer(output_dir, train_steps, strategy, hp=None, callbacks=()):
    options = TrainerOptions(
        problem="algorithmic_reverse",
        model="transformer",
        output_dir=output_dir,
        train_steps=train_steps,
        local_eval_frequency=0,
        save_checkpoints_steps=1000,
        log_steps=1000,
        eval_steps=2,
    )
    return Trainer(options, hp or hparams(), strategy=strategy, callbacks=callbacks)


def state(t):
    """Weights and optimizer variables (slots, counters) as numpy arrays."""
    return [v.numpy() for v in t.model.weights] + [
        np.asarray(tf.convert_to_tensor(v)) for v in t.optimizer.variables
    ]


def ratio(actual, expected, rtol=1e-5, atol=1e-7):
    return max(
        float(np.max(np.abs(a - e) / (rtol * np.abs(e) + atol)))
        for a, e in zip(actual, expected)
    )


class ReductionCounter:
    """Counts the sums over replicas asked of `strategy` (reduce_to: how TF reads a
    replica-local variable on the host; batch_reduce_to: many at once)."""

    def __init__(self, strategy):
        self.calls = 0
        extended = strategy.extended
        for name in ("reduce_to", "batch_reduce_to"):
            setattr(extended, name, self._counted(getattr(extended, name)))

    def _counted(self, method):
        def counted(*args, **kwargs):
            self.calls += 1
            return method(*args, **kwargs)

        return counted


def replica_sums(prefix):
    """The accumulators' and noise scale's tensors in checkpoint `prefix`."""
    reader = tf.train.load_checkpoint(prefix)
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.startswith(("accumulator/", "noise_scale/"))
    }


def check_save(t, root, reductions):
    """`t` stopped inside a window. Its checkpoint, and one more save through a
    CheckpointKeeper as the trainer's, against TF writing the same items itself:
    the replica sums' keys and values, and the reductions each save asks for."""
    calls = reductions.calls
    own = tf.train.Checkpoint(**t.step.checkpoint_items()).write(f"{root}/own/ckpt")
    own_reductions, calls = reductions.calls - calls, reductions.calls
    keeper = CheckpointKeeper(
        t.checkpoint,
        f"{root}/keeper",
        2,
        t.model.trainable_variables,
        stand_ins=t.step.checkpoint_stand_ins,
    )
    saved = keeper.save(t.step.micro_step)
    save_reductions = reductions.calls - calls
    expected = replica_sums(own)
    differing = []
    for prefix in (saved, t.checkpoints.latest):
        got = replica_sums(prefix)
        differing += sorted(set(got) ^ set(expected))
        differing += [k for k in expected if not np.array_equal(got[k], expected[k])]
    return {
        "save_reductions": save_reductions,
        "own_save_reductions": own_reductions,
        "replica_sum_keys": len(expected),
        "saved_tokens": float(
            expected["accumulator/tokens/.ATTRIBUTES/VARIABLE_VALUE"]
        ),
        "saved_differing": differing,
    }


def check_resume(root, strategy, reductions):
    whole = trainer(f"{root}/whole", 9, strategy)
    whole.train()
    first = trainer(f"{root}/split", 9, strategy, callbacks=[StopAt(3)])
    first.train()  # stopped after micro-step 4 of 9: inside the second window
    stopped_at = first.step.micro_step
    saves = check_save(first, f"{root}/saves", reductions)
    second = trainer(f"{root}/split", 9, strategy)
    second.train()
    return {
        "resume_ratio": ratio(state(second), state(whole)),
        "resume_updates": second.step.update_step,
        "resume_micro_steps": second.step.micro_step,
        "stopped_at": stopped_at,
        "stopped_by": first.stopped_by,
        **saves,
    }


class WarningCatcher(std_logging.Handler):
    def __init__(self):
        super().__init__(std_logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def check_replica_change(root, mirrored):
    """A 1-replica run of 3 micro-steps resumed on 2 replicas to 6, and the
    2-replica run check_resume trained uninterrupted (9 micro-steps), copied,
    resumed on 1 replica to 12. The first run has dropout on, for check_dropout."""
    catcher = WarningCatcher()
    std_logging.getLogger("absl").addHandler(catcher)
    single = tf.distribute.get_strategy()
    dropout = hparams(layer_prepostprocess_dropout=0.5)
    trainer(f"{root}/one_to_two", 3, single, dropout).train()
    grown = trainer(f"{root}/one_to_two", 6, mirrored, dropout)
    grown.train()
    shutil.copytree(f"{root}/whole", f"{root}/two_to_one")
    shrunk = trainer(f"{root}/two_to_one", 12, single)
    shrunk.train()
    std_logging.getLogger("absl").removeHandler(catcher)
    changes = [m for m in catcher.messages if "replica(s) on" in m]
    return grown, {
        "replica_change_warnings": changes,
        "grown_updates": grown.step.update_step,
        "shrunk_updates": shrunk.step.update_step,
    }


def check_dropout(t, strategy):
    """One more micro-step (an accumulate-only one, already traced) of a trained
    2-replica run with dropout 0.5, fed the SAME batch on both replicas: the
    per-replica losses."""
    assert not t.step.is_update_micro_step(t.step.micro_step)
    batch = next(iter(t.dataset("train", training=True, seed=1)))
    same = strategy.experimental_distribute_values_from_function(lambda ctx: batch)
    out = t.step.train_on(same, closes_window=False)
    losses = [float(x) for x in out["loss_sum"]]
    return {"dropout_replica_losses": losses}


def check_effective_batch(root, mirrored):
    hp = hparams(optimizer_multistep_accumulate_steps=1, effective_batch_size=192)
    one = trainer(f"{root}/effective", 3, tf.distribute.get_strategy(), hp)
    one.train()
    with open(f"{root}/effective/run.json") as f:
        recorded = json.load(f)["accumulate_steps"]
    try:
        trainer(f"{root}/effective", 6, mirrored, hp)
        refusal = None
    except UserError as e:
        refusal = str(e)
    return {
        "effective_n": one.n,
        "effective_updates": one.step.update_step,
        "effective_recorded_n": recorded,
        "effective_refusal": refusal,
    }


def main():
    root = sys.argv[1]
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    reductions = ReductionCounter(strategy)
    report = {}
    report.update(check_resume(root, strategy, reductions))
    grown, changes = check_replica_change(root, strategy)
    report.update(changes)
    report.update(check_dropout(grown, strategy))
    report.update(check_effective_batch(root, strategy))
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
