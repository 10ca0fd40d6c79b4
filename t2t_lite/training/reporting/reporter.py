"""What a run reports while it trains (Reporter): TensorBoard summaries, the step
and evaluation lines, the watch over skipped (NaN/Inf) updates that raises
DivergenceError, the hparams on TensorBoard's HParams dashboard, and a warning when
a resume changes train_steps (which moves the schedule's linear_decay).

Library code: plain arguments, never flags.
"""

import os

import tensorflow as tf
from absl import logging

from t2t_lite.constants import EVAL_METRICS
from t2t_lite.errors import UserError
from t2t_lite.outputs.checkpoints import checkpoints_on_disk
from t2t_lite.training.reporting.progress import format_seconds

# Built-in learning-rate factors that read train_steps (optim/schedule.py).
TRAIN_STEPS_FACTORS = ("linear_decay",)


class DivergenceError(UserError):
    """Too many NaN/Inf updates in a row; the message says what to do."""


class Reporter:
    """What a run reports while it trains: TensorBoard summaries, log lines, and
    skipped updates.

    The chief writes OUTPUT_DIR/train and OUTPUT_DIR/eval; other workers get no-op
    writers, so the loop needs no chief checks around its summaries.
    """

    def __init__(self, output_dir, chief, parts, hp, checkpoints):
        """parts: the TrainingParts (training/opening/build.py) whose train step's
        counters and schedule's rates are logged; checkpoints: the CheckpointKeeper, whose
        newest good checkpoint DivergenceError names."""
        self.output_dir = output_dir
        self.chief = chief
        self.step, self.schedule, self.hp = parts.step, parts.schedule, hp
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


def grad_norm_text(grad_norm, clipped, clip_grad_norm):
    """The log line's ", grad norm 1.23 (4 clipped)" ("" before any update); the
    clipped count appears only when clip_grad_norm > 0."""
    if grad_norm is None:
        return ""
    text = f", grad norm {grad_norm:.3g}"
    if clip_grad_norm > 0:
        text += f" ({clipped} clipped)"
    return text


def check_train_steps_change(output_dir, previous, train_steps, hp):
    """Warns once when a run that has checkpoints resumes with another train_steps:
    schedule factors that use it (linear_decay) now decay toward another end, so the
    learning rate moves at once. Never refuses."""
    if previous is None or previous == train_steps:
        return
    if not checkpoints_on_disk(output_dir):
        return
    factors = [
        f.strip()
        for f in hp.learning_rate_schedule.split("*")
        if f.strip() in TRAIN_STEPS_FACTORS
    ]
    effect = (
        f"the schedule's {', '.join(factors)} now ends at the new train_steps, so "
        "the learning rate moves from this step on"
        if factors
        else "factors that use train_steps (e.g. linear_decay; none of the built-in "
        "ones in this schedule) would move"
    )
    logging.warning(
        "Resuming with train_steps=%d; the run started with train_steps=%d: %s.",
        train_steps,
        previous,
        effect,
    )


def write_hparams_summary(writer, hp, config, step):
    """The run's hparams (and problem, model, train_steps) on TensorBoard's HParams
    dashboard, written into `writer`'s directory once per run start."""
    try:
        from tensorboard.plugins.hparams import api as hparams_api
    except ImportError:  # TensorBoard is optional at run time
        logging.info("tensorboard is not installed: no HParams dashboard entry.")
        return
    values = {
        key: value
        for key, value in hp.values().items()
        if isinstance(value, (bool, int, float, str))
    }
    values.update(
        problem=config.problem, model=config.model, train_steps=config.train_steps
    )
    with writer.as_default(step=step):
        hparams_api.hparams(values, trial_id=os.path.basename(config.output_dir))
