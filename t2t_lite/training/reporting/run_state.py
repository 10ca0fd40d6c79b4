"""A training run's bookkeeping, kept apart from the loop in training/loop/trainer.py.

The loop decides what to compute; this module holds what it remembers and reports
as it goes, so that each can be read on its own:

- RunState: the best checkpoint (runs/best.py), early stopping and the elapsed
  training time. After a restore it is rebuilt from the run directory (best.json,
  metrics.jsonl), so a resumed run keeps the same best checkpoint, stops early
  at the same step and counts elapsed_seconds across restarts, as an
  uninterrupted run would.
- RunLog: TensorBoard writers, the periodic step line, the evaluation line, and
  the watch over skipped (NaN/Inf) updates that raises DivergenceError.

Library code: plain arguments, never flags.
"""

import os
import time

import tensorflow as tf
from absl import logging

from t2t_lite.constants import EVAL_METRICS
from t2t_lite.errors import UserError
from t2t_lite.runs import run_dir
from t2t_lite.runs.best import BestCheckpoint
from t2t_lite.training.reporting.progress import format_seconds
from t2t_lite.training.reporting.run_info import grad_norm_text


class DivergenceError(UserError):
    """Too many NaN/Inf updates in a row; the message says what to do."""


class RunState:
    """The best evaluation so far, early stopping on it, and elapsed time.

    Every worker keeps one (they all read best.json to decide whether a resumed run
    had stopped early); only the chief's sees evaluation records.
    """

    def __init__(self, output_dir, metric, minimize, patience, save, workers=1):
        """metric, minimize, patience: eval_early_stopping_metric, _minimize and
        _steps (0: never stop early). save: writes a checkpoint of the current
        step and returns its path (Trainer.save), for a best evaluation that fell
        between checkpoint steps. workers: the strategy's worker count."""
        self.output_dir = output_dir
        self.patience = patience
        self.best = BestCheckpoint(output_dir, metric, minimize)
        self.early_stopped = None  # why, when early stopping ended the run
        self.last_eval_step = None  # the newest evaluation at or before the restore
        self._save = save
        self._workers = workers
        self._elapsed_base, self._started = 0.0, time.time()  # elapsed_seconds

    def recover(self, start):
        """After a restore to global step `start`: the best checkpoint so far, the
        last evaluation's step and the elapsed training time, from best.json and
        metrics.jsonl (records past `start` belong to an abandoned future)."""
        records = [
            r
            for r in run_dir.read_metrics(self.output_dir)
            if r.get("global_step", start + 1) <= start
        ]
        self.last_eval_step = records[-1]["global_step"] if records else None
        self._elapsed_base = (
            float(records[-1].get("elapsed_seconds", 0.0)) if records else 0.0
        )
        self._started = time.time()
        self.best.recover(start)

    def had_stopped_early(self):
        """Whether the restored run's last evaluation had already used up the
        patience: training on would only stop again (sets `early_stopped`)."""
        return self.last_eval_step is not None and self.should_stop_early(
            self.last_eval_step
        )

    def track_best(self, record):
        """Keeps the checkpoint of an evaluation that improves on the best one
        (runs/best.py); returns the fields every metrics.jsonl record gains:
        wall_time, elapsed_seconds (since the run began, across resumes) and the
        best so far (best_checkpoint, best_<metric>, best_global_step)."""
        if self.best.improves(record):
            prefix = self.checkpoint_of(record["global_step"])
            if prefix:
                self.best.keep(
                    record,
                    prefix,
                    [
                        os.path.join(self.output_dir, name)
                        for name in (run_dir.HPARAMS_FILE, run_dir.RUN_FILE)
                    ],
                )
                logging.info("New best checkpoint: %s.", self.best.describe())
        return {
            "wall_time": time.time(),
            "elapsed_seconds": self._elapsed_base + time.time() - self._started,
            **self.best.fields(),
        }

    def checkpoint_of(self, step):
        """The checkpoint of `step`, written now if the evaluation's step was not a
        checkpoint step (one worker only: saving is collective on many, so there
        only evaluations at checkpoint steps can become the best one)."""
        prefix = os.path.join(self.output_dir, f"model-{step}")
        if tf.io.gfile.exists(prefix + ".index"):
            return prefix
        if self._workers == 1:
            return self._save()
        logging.warning(
            "Evaluation at step %d is not at a checkpoint step: it cannot become the "
            "best checkpoint on many workers (make local_eval_frequency a multiple "
            "of save_checkpoints_steps).",
            step,
        )
        return None

    def should_stop_early(self, global_step):
        """Whether the metric has not improved for `patience` steps (T2T: global
        steps since the best evaluation); sets `early_stopped` and logs why."""
        waited = self.best.steps_without_improvement(global_step)
        if self.patience <= 0 or self.best.best is None or waited < self.patience:
            return False
        self.early_stopped = (
            f"{self.best.metric} has not improved for {waited} steps "
            f"(eval_early_stopping_steps={self.patience}); best: "
            f"{self.best.describe()}"
        )
        logging.info("Stopping early at step %d: %s.", global_step, self.early_stopped)
        return True


class RunLog:
    """What a run reports while it trains: TensorBoard summaries, log lines, and
    skipped updates.

    The chief writes OUTPUT_DIR/train and OUTPUT_DIR/eval; other workers get no-op
    writers, so the loop needs no chief checks around its summaries.
    """

    def __init__(self, output_dir, chief, run, hp, checkpoints):
        """run: the built run (training/opening/build.py), whose train step's counters and
        schedule's rates are logged; checkpoints: the CheckpointKeeper, whose
        newest good checkpoint DivergenceError names."""
        self.output_dir = output_dir
        self.chief = chief
        self.step, self.schedule, self.hp = run.step, run.schedule, hp
        self.checkpoints = checkpoints
        self._writers = {}  # TensorBoard writers by subdirectory, opened on first use
        self._skipped_seen = 0  # skipped updates already reported in the log

    def writer(self, name):
        """TensorBoard writer of OUTPUT_DIR/name; a no-op on workers but the chief."""
        if name not in self._writers:
            self._writers[name] = (
                tf.summary.create_file_writer(os.path.join(self.output_dir, name))
                if self.chief
                else tf.summary.create_noop_writer()
            )
        return self._writers[name]

    def close(self):
        for writer in self._writers.values():
            writer.close()

    def check_divergence(self, done):
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

    def tokens_per_update(self, size=None):
        """The tokens (padding included, all replicas) a window of `size`
        micro-batches is planned for; the current window's by default."""
        size = size or self.step.window()[0]
        return size * self.hp.batch_size * self.step.strategy.num_replicas_in_sync

    def window_size(self, done, size, previous):
        """A batch-size schedule's window size changed (or training started)."""
        logging.info(
            "%s at step %d, update %d: %d accumulation steps = %d tokens/update.",
            "Batch size" if previous is None else f"Batch size grows from {previous}",
            done,
            self.step.update_step,
            size,
            self.tokens_per_update(size),
        )

    def batch_decision(self, update, old, new, noise_scale, facts="", size=None):
        """An adaptive batch's decision at update `update`: its target tokens per
        update went from `old` to `new`, which windows of `size` micro-batches
        hold. `facts`: what else the plan decided from (e.g. a time-optimal
        plan's update cost)."""
        measured = f"{noise_scale:.0f} tokens" if noise_scale else "not measured yet"
        logging.info(
            "Adaptive batch at update %d: noise scale %s%s; tokens per update "
            "%d -> %d%s.",
            update,
            measured,
            f", {facts}" if facts else "",
            old,
            new,
            f" ({size} micro-batches)" if size else "",
        )
        with self.writer("train").as_default(step=self.step.micro_step):
            tf.summary.scalar("adaptive_target_tokens", new)

    def applied_rate(self):
        """The learning rate of the last applied update (with a rate that follows
        the batch, what the optimizer used, not the schedule alone); before the
        first update, the first update's."""
        update = self.step.update_step
        rate = float(tf.convert_to_tensor(self.step.clock.applied_rate))
        if update == 0 or rate == 0.0:  # a checkpoint from before the clock
            rate = float(self.schedule(max(update - 1, 0)))
        return rate

    def progress_record(self):
        """Batch-size facts for an evaluation record: tokens per update of the
        current window, non-pad target tokens trained on, the noise scale."""
        record = {
            "tokens_per_update": self.tokens_per_update(),
            "tokens_seen": int(tf.convert_to_tensor(self.step.tokens_seen)),
            "learning_rate": self.applied_rate(),
        }
        noise = self.step.noise_scale_value()
        if noise is not None:
            record["noise_scale"] = noise
        splits = int(tf.convert_to_tensor(self.step.oom_splits))
        if splits:
            record["oom_splits"] = splits
        return record

    def training(self, meter, done):
        """The step line and train/ summaries at global step `done`; `meter`
        (progress.py) averages loss and throughput since the previous line."""
        loss, tokens_per_s, eta = meter.take()
        update = self.step.update_step
        facts = self.progress_record()
        rate = facts.pop("learning_rate")
        with self.writer("train").as_default(step=done):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", rate)
            tf.summary.scalar("tokens_per_second", tokens_per_s)
            tf.summary.scalar("update_step", update)  # t2t-plot's x when n varies
            for key, value in facts.items():
                tf.summary.scalar(key, value)
            tf.summary.scalar(
                "skipped_updates", tf.convert_to_tensor(self.step.skipped_updates)
            )
            scaling = self._loss_scale_state()
            if scaling:
                tf.summary.scalar("loss_scale", scaling[0])
                tf.summary.scalar("overflow_updates", scaling[1])
            clipped = int(tf.convert_to_tensor(self.step.clipped_updates))
            if meter.grad_norm is not None:
                tf.summary.scalar("grad_norm", meter.grad_norm)
            tf.summary.scalar("clipped_updates", clipped)
        logging.info(
            "step %d, update %d, loss %.4f, lr %.3g%s, %.0f tokens/s, ETA %s%s%s",
            done,
            update,
            loss,
            rate,
            grad_norm_text(meter.grad_norm, clipped, self.hp.clip_grad_norm),
            tokens_per_s,
            format_seconds(eta),
            _loss_scale_text(scaling),
            self._batch_text(facts),
        )

    def _batch_text(self, facts):
        """The log line's tokens per update (when windows vary) and noise scale."""
        text = ""
        if not self.step.plan.constant:
            text += f", {facts['tokens_per_update']} tokens/update"
        if "noise_scale" in facts:
            text += f", noise scale ≈ {_short(facts['noise_scale'])} tokens/update"
        if "oom_splits" in facts:
            text += f", {facts['oom_splits']} out-of-memory splits"
        return text

    def evaluation(self, record, summaries=True):
        """The evaluation line of `record`, and its eval/ summaries unless
        summaries=False (an evaluation that is not recorded in metrics.jsonl)."""
        if summaries:
            with self.writer("eval").as_default(step=record["global_step"]):
                for key in EVAL_METRICS:
                    if key in record:
                        tf.summary.scalar(key, record[key])
        logging.info(
            "Eval at step %d (update %d): loss %.4f, accuracy %.4f, "
            "sequence accuracy %.4f%s",
            record["global_step"],
            record["update_step"],
            record["loss"],
            record["accuracy"],
            record["sequence_accuracy"],
            f", BLEU {record['bleu']:.2f}" if "bleu" in record else "",
        )

    def _loss_scale_state(self):
        """(loss scale, updates skipped for overflow) under float16, else None."""
        scale = self.step.loss_scale
        if scale is None:
            return None
        return float(tf.convert_to_tensor(scale.scale)), int(
            tf.convert_to_tensor(scale.overflows)
        )


def _short(tokens):
    """41234 → "41k", 1.5e6 → "1.5M", 812 → "812"."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if tokens >= size:
            return f"{tokens / size:.3g}{unit}"
    return f"{tokens:.0f}"


def _loss_scale_text(scaling):
    """The log line's loss-scale part under float16 ("" otherwise)."""
    if not scaling:
        return ""
    scale, overflows = scaling
    return f", loss scale {scale:g} ({overflows} overflow updates skipped)"
