"""The training loop: build everything from names + hparams, train, evaluate, save.

Library code: it takes a `RunConfig` and an HParams, never flags (bin/trainer.py owns
the flags).
"""

import dataclasses
import os

import keras
import tensorflow as tf
from absl import logging

from t2t_lite.data.pipeline import make_dataset
from t2t_lite.decoding.decoder import decode_hparams
from t2t_lite.errors import UserError
from t2t_lite.hparams_checks import validate
from t2t_lite.optim.optimizers import optimizer_from_hparams
from t2t_lite.optim.schedule import accumulate_steps, schedule_from_hparams
from t2t_lite.registry import MODELS, PROBLEMS
from t2t_lite.training import run_dir
from t2t_lite.training.checkpoints import CheckpointKeeper
from t2t_lite.training.evaluation import BleuEvaluator, Evaluator
from t2t_lite.training.preemption import StopRequest
from t2t_lite.training.progress import ThroughputMeter, format_seconds
from t2t_lite.training.train_step import TrainStep


class DivergenceError(UserError):
    """Too many NaN/Inf updates in a row; the message says what to do."""


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
    deterministic: bool = False  # TF op determinism: bitwise-repeatable runs, slower
    # BLEU at every evaluation, for problems with dev text (translation problems):
    eval_bleu_sentences: int = 0  # dev sentences decoded; 0: no BLEU; < 0: all
    eval_decode_hparams: str = "beam_size=1"  # greedy: a cheap trend


def simulation_line(hp, replicas):
    """The start-up line stating what a micro-step and an update stand for."""
    n = accumulate_steps(hp)
    per_update = hp.batch_size * n * replicas
    return (
        f"micro-batch {hp.batch_size} tokens × {n} accumulation steps × "
        f"{replicas} replica{'s' if replicas != 1 else ''} = {per_update} "
        f"tokens/update (simulating {n * replicas} GPU{'s' if n * replicas != 1 else ''})"
    )


class Trainer:
    """Owns model, optimizer, train step, evaluator and checkpoint manager of one run."""

    def __init__(self, config, hp, strategy=None):
        self.config = config
        self.hp = validate(hp)
        self.stopped_by = None  # the signal's name when a SIGTERM/SIGINT ended train()
        self._skipped_seen = 0  # skipped updates already reported in the log
        self.strategy = strategy or tf.distribute.get_strategy()
        if self.strategy.num_replicas_in_sync > 1:
            raise NotImplementedError(
                "Trainer does not distribute its input over replicas yet; TrainStep "
                "does (see tests/test_distributed.py)."
            )
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
        if config.deterministic:
            tf.config.experimental.enable_op_determinism()
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
        self.bleu_evaluator = None
        if config.eval_bleu_sentences and self.problem.reports_bleu:
            self.bleu_evaluator = BleuEvaluator(
                self.model,
                self.problem,
                decode_hparams(config.eval_decode_hparams, "--eval_decode_hparams"),
                config.eval_bleu_sentences,
                max_input_length=hp.max_length or hp.batch_size,
            )
        self.checkpoint = tf.train.Checkpoint(**self.step.checkpoint_items())
        self._writers = {}  # TensorBoard writers by subdirectory, opened on first use
        self.checkpoints = CheckpointKeeper(
            self.checkpoint,
            config.output_dir,
            config.keep_checkpoint_max,
            self.model.trainable_variables,
        )

    # --- checkpoints --------------------------------------------------------------

    def restore(self):
        """Restores the newest readable checkpoint, if any; returns the global step."""
        path = self.checkpoints.restore_newest_readable()
        if path:
            logging.info(
                "Resumed from %s (global step %d, update %d).",
                path,
                self.step.micro_step,
                self.step.update_step,
            )
        return self.step.micro_step

    def save(self):
        """Writes a checkpoint at the current step; returns its path (None if the
        weights were not finite and nothing was written)."""
        path = self.checkpoints.save(self.step.micro_step)
        if path:
            logging.info("Saved checkpoint %s.", path)
        return path

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

    def evaluate(self, write=True, stop=None):
        """Evaluates on the dev split; appends to metrics.jsonl and TensorBoard
        unless write=False. Returns None if a stop request interrupted it."""
        metrics = self.evaluator.evaluate(
            self.dataset("dev", training=False),
            self.config.eval_steps,
            should_stop=lambda: bool(stop and stop.requested),
        )
        if metrics is None:
            return None
        if self.bleu_evaluator:
            bleu = self.bleu_evaluator.evaluate(lambda: bool(stop and stop.requested))
            if bleu is None:
                return None
            metrics.update(bleu)
        record = {
            "global_step": self.step.micro_step,
            "update_step": self.step.update_step,
            **metrics,
        }
        if write:
            run_dir.append_metrics(self.config.output_dir, record)
            with self._writer("eval").as_default(step=record["global_step"]):
                for key in ("loss", "accuracy", "sequence_accuracy", "bleu"):
                    if key in metrics:
                        tf.summary.scalar(key, metrics[key])
        logging.info(
            "Eval at step %d (update %d): loss %.4f, accuracy %.4f, "
            "sequence accuracy %.4f%s",
            record["global_step"],
            record["update_step"],
            metrics["loss"],
            metrics["accuracy"],
            metrics["sequence_accuracy"],
            f", BLEU {metrics['bleu']:.2f}" if "bleu" in metrics else "",
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
        """Trains up to train_steps micro-steps; returns the final evaluation record.

        Returns None when a SIGTERM/SIGINT stopped the run early (after saving a
        checkpoint; `stopped_by` names the signal). Raises DivergenceError after
        max_consecutive_bad_updates NaN/Inf updates in a row.
        """
        config = self.config
        # The input iterator is checkpointed with the model (shuffle buffer and bucket
        # contents included), so a resumed run sees exactly the batches an uninterrupted
        # run would have seen next.
        batches = iter(self.dataset("train", training=True, seed=config.random_seed))
        self.checkpoint.train_iterator = batches
        start = self.restore()
        if start >= config.train_steps:
            logging.info("Already trained to step %d; evaluating only.", start)
            return self.evaluate(write=False)
        logging.info(simulation_line(self.hp, self.strategy.num_replicas_in_sync))
        if config.train_steps % self.n:
            logging.warning(
                "train_steps=%d is not a multiple of %d accumulation steps: the last "
                "%d micro-batches will not reach the weights.",
                config.train_steps,
                self.n,
                config.train_steps % self.n,
            )
        try:
            with StopRequest() as stop:
                record = self._loop(batches, start, stop)
        finally:
            self._close_writers()
        return record

    def _loop(self, batches, start, stop):
        config = self.config
        meter = ThroughputMeter(start, config.train_steps)
        record, last_saved = None, start
        for step in range(start, config.train_steps):
            meter.add(self.step(_next_batch(batches), step))
            done, record = step + 1, None
            saving = done % config.save_checkpoints_steps == 0
            logging_now = done % config.log_steps == 0 or done == config.train_steps
            if logging_now or saving or stop.requested:
                self._check_divergence(done)
            if logging_now:
                self._log(meter, done)
            # A signal may arrive at any point above: read stop.requested only here,
            # once, so a stop always comes with a checkpoint of this very step.
            stopping = stop.requested
            if saving or stopping:
                self.save()
                last_saved = done
            if stopping:
                self.stopped_by = stopping
                return None
            if config.local_eval_frequency and done % config.local_eval_frequency == 0:
                record = self.evaluate(stop=stop)
        if last_saved != config.train_steps:
            self.save()
        record = record or self.evaluate(stop=stop)
        if record is None:  # stopped during the final evaluation; already saved
            self.stopped_by = stop.requested
        return record

    def _check_divergence(self, done):
        """Logs skipped updates; raises DivergenceError after too many in a row.

        Read at log and checkpoint boundaries only (a host sync), not per update:
        skipped updates change nothing, so noticing a streak late costs nothing.
        """
        in_a_row = int(tf.convert_to_tensor(self.step.bad_updates_in_a_row))
        total = int(tf.convert_to_tensor(self.step.skipped_updates))
        if total > self._skipped_seen:
            logging.warning(
                "Skipped updates with a NaN/Inf loss, gradient or learning rate: "
                "%d in total, %d in a row at step %d.",
                total,
                in_a_row,
                done,
            )
            self._skipped_seen = total
        if in_a_row >= self.hp.max_consecutive_bad_updates:
            raise DivergenceError(
                f"training diverged: {in_a_row} updates in a row had a NaN/Inf loss "
                f"or gradient (by step {done}); the newest good checkpoint is "
                f"{self.checkpoints.latest}. Lower learning_rate_constant or set "
                "clip_grad_norm (both may change on resume), then rerun."
            )

    def _log(self, meter, done):
        loss, tokens_per_s, eta = meter.take()
        update = self.step.update_step
        rate = float(self.schedule(max(update - 1, 0)))
        with self._writer("train").as_default(step=done):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", rate)
            tf.summary.scalar("tokens_per_second", tokens_per_s)
            tf.summary.scalar(
                "skipped_updates", tf.convert_to_tensor(self.step.skipped_updates)
            )
        logging.info(
            "step %d, update %d, loss %.4f, lr %.3g, %.0f tokens/s, ETA %s",
            done,
            update,
            loss,
            rate,
            tokens_per_s,
            format_seconds(eta),
        )

    def _close_writers(self):
        for writer in self._writers.values():
            writer.close()


def _next_batch(batches):
    try:
        return next(batches)
    except StopIteration:
        raise UserError(
            "the training split produced no batches: are all examples longer "
            "than max_length?"
        ) from None


def _dummy_batch():
    return {"inputs": tf.ones([1, 2], tf.int32), "targets": tf.ones([1, 2], tf.int32)}
