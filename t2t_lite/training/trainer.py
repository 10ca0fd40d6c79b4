"""The training loop: build everything from names + hparams, train, evaluate, save.

Library code: it takes a `RunConfig` and an HParams, never flags (bin/trainer.py owns
the flags).
"""

import dataclasses
import math
import os
import time

import keras
import tensorflow as tf
from absl import logging

from t2t_lite.data.pipeline import make_dataset
from t2t_lite.optim.optimizers import optimizer_from_hparams
from t2t_lite.optim.schedule import accumulate_steps, schedule_from_hparams
from t2t_lite.registry import MODELS, PROBLEMS
from t2t_lite.training import run_dir
from t2t_lite.training.evaluation import Evaluator
from t2t_lite.training.train_step import TrainStep


@dataclasses.dataclass
class RunConfig:
    """What a run needs besides hparams (T2T's flag names)."""

    problem: str
    model: str
    output_dir: str
    train_steps: int  # micro-steps (batches consumed), as in T2T
    data_dir: str = ""
    eval_steps: int = 100  # dev batches per evaluation; <= 0: the whole dev set
    local_eval_frequency: int = 1000
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 20
    log_steps: int = 100
    random_seed: int = 1


def simulation_line(hp, replicas):
    """The start-up line stating what a micro-step and an update stand for."""
    n = accumulate_steps(hp)
    per_update = hp.batch_size * n * replicas
    return (
        f"micro-batch {hp.batch_size} tokens × {n} accumulation steps × "
        f"{replicas} replica{'s' if replicas != 1 else ''} = {per_update} "
        f"tokens/update (simulating {n * replicas} GPUs)"
    )


class Trainer:
    """Owns model, optimizer, train step, evaluator and checkpoint manager of one run."""

    def __init__(self, config, hp, strategy=None):
        self.config = config
        self.hp = hp
        self.strategy = strategy or tf.distribute.get_strategy()
        self.problem = PROBLEMS.get(config.problem)()
        self.problem.load(config.data_dir or None)
        model_class = MODELS.get(config.model)
        self.n = accumulate_steps(hp)
        run_dir.prepare_output_dir(config.output_dir, hp)
        run_dir.check_run_identity(
            config.output_dir,
            {
                "problem": config.problem,
                "model": config.model,
                "vocab_fingerprint": self.problem.vocab_fingerprint(),
            },
        )
        keras.utils.set_random_seed(config.random_seed)
        with self.strategy.scope():
            self.model = model_class.from_hparams(hp, self.problem.vocab_size)
            self.model(_dummy_batch(), training=False)  # create the variables
            schedule = schedule_from_hparams(hp, config.train_steps)
            self.optimizer = optimizer_from_hparams(hp, schedule)
        self.schedule = schedule
        self.step = TrainStep(
            self.model,
            self.optimizer,
            accumulate_steps=self.n,
            label_smoothing=hp.label_smoothing,
            clip_grad_norm=hp.clip_grad_norm,
            weight_decay=hp.weight_decay,
            strategy=self.strategy,
        )
        self.evaluator = Evaluator(self.model, hp.label_smoothing)
        self.checkpoint = tf.train.Checkpoint(**self.step.checkpoint_items())
        self._writers = {}  # TensorBoard writers by subdirectory, opened on first use
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            config.output_dir,
            max_to_keep=config.keep_checkpoint_max,
            checkpoint_name="model",
        )

    # --- checkpoints --------------------------------------------------------------

    def restore(self):
        """Restores the latest checkpoint in output_dir, if any; returns the global step."""
        latest = self.manager.latest_checkpoint
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            logging.info(
                "Resumed from %s (global step %d, update %d).",
                latest,
                self.step.micro_step,
                self.step.update_step,
            )
        return self.step.micro_step

    def save(self):
        step = self.step.micro_step
        path = self.manager.save(checkpoint_number=step)
        logging.info("Saved checkpoint %s.", path)

    # --- data ---------------------------------------------------------------------

    def dataset(self, split, training, seed=None):
        hp = self.hp
        return make_dataset(
            self.problem.dataset(split, self.config.data_dir or None),
            batch_size=hp.batch_size,
            max_length=hp.max_length,
            min_length_bucket=hp.min_length_bucket,
            length_bucket_step=hp.length_bucket_step,
            training=training,
            seed=seed,
        )

    # --- evaluation ---------------------------------------------------------------

    def evaluate(self):
        metrics = self.evaluator.evaluate(
            self.dataset("dev", training=False), self.config.eval_steps
        )
        record = {
            "global_step": self.step.micro_step,
            "update_step": self.step.update_step,
            **metrics,
        }
        run_dir.append_metrics(self.config.output_dir, record)
        with self._writer("eval").as_default(step=record["global_step"]):
            for key in ("loss", "accuracy", "sequence_accuracy"):
                tf.summary.scalar(key, metrics[key])
        logging.info(
            "Eval at step %d (update %d): loss %.4f, accuracy %.4f, "
            "sequence accuracy %.4f",
            record["global_step"],
            record["update_step"],
            metrics["loss"],
            metrics["accuracy"],
            metrics["sequence_accuracy"],
        )
        return record

    def _writer(self, name):
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(
                os.path.join(self.config.output_dir, name)
            )
        return self._writers[name]

    # --- the loop -------------------------------------------------------------------

    def train(self):
        """Trains up to train_steps micro-steps; returns the final evaluation record."""
        config = self.config
        # The input iterator is checkpointed with the model (shuffle buffer and bucket
        # contents included), so a resumed run sees exactly the batches an uninterrupted
        # run would have seen next.
        batches = iter(self.dataset("train", training=True, seed=config.random_seed))
        self.checkpoint.train_iterator = batches
        start = self.restore()
        logging.info(simulation_line(self.hp, self.strategy.num_replicas_in_sync))
        meter = _ThroughputMeter(start, config.train_steps)
        last_saved = start
        record = None
        for step in range(start, config.train_steps):
            out = self.step(next(batches), step)
            meter.add(out)
            done = step + 1
            record = None
            if done % config.log_steps == 0 or done == config.train_steps:
                self._log(meter, done)
            if done % config.save_checkpoints_steps == 0:
                self.save()
                last_saved = done
            if (
                config.local_eval_frequency > 0
                and done % config.local_eval_frequency == 0
            ):
                record = self.evaluate()
        if last_saved != config.train_steps and start < config.train_steps:
            self.save()
        record = record or self.evaluate()
        self._close_writers()
        return record

    def _log(self, meter, done):
        loss, tokens_per_s, eta = meter.take()
        update = self.step.update_step
        rate = float(self.schedule(max(update - 1, 0)))
        with self._writer("train").as_default(step=done):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", rate)
            tf.summary.scalar("tokens_per_second", tokens_per_s)
        logging.info(
            "step %d, update %d, loss %.4f, lr %.3g, %.0f tokens/s, ETA %s",
            done,
            update,
            loss,
            rate,
            tokens_per_s,
            _format_seconds(eta),
        )

    def _close_writers(self):
        for writer in self._writers.values():
            writer.close()


class _ThroughputMeter:
    """Loss per token and target tokens/s since the last log line, and the ETA."""

    def __init__(self, start_step, total_steps):
        self.step, self.total = start_step, total_steps
        self.loss_sum = self.tokens = 0.0
        self.steps = 0
        self.since = time.perf_counter()

    def add(self, out):
        self.loss_sum += float(out["loss_sum"])
        self.tokens += float(out["tokens"])
        self.steps += 1

    def take(self):
        elapsed = max(time.perf_counter() - self.since, 1e-9)
        self.step += self.steps
        loss = self.loss_sum / max(self.tokens, 1.0)
        tokens_per_s = self.tokens / elapsed
        eta = (self.total - self.step) * elapsed / max(self.steps, 1)
        self.loss_sum = self.tokens = 0.0
        self.steps = 0
        self.since = time.perf_counter()
        return loss, tokens_per_s, eta


def _format_seconds(seconds):
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _dummy_batch():
    return {"inputs": tf.ones([1, 2], tf.int32), "targets": tf.ones([1, 2], tf.int32)}
