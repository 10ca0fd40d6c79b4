"""What a run remembers of its evaluations (EvalTracker): the best checkpoint
(outputs/best.py), early stopping and the elapsed training time. After a restore it
is rebuilt from the output directory (best.json, metrics.jsonl), so a resumed run
keeps the same best checkpoint, stops early at the same step and counts
elapsed_seconds across restarts, as an uninterrupted run would.

Library code: plain arguments, never flags.
"""

import os
import time

import tensorflow as tf
from absl import logging

from t2t_lite.outputs import run_files
from t2t_lite.outputs.best import BestCheckpoint


class EvalTracker:
    """The best evaluation so far, early stopping on it, and elapsed time.

    Every worker keeps one (they all read best.json to decide whether a resumed run
    had stopped early); only the chief's sees evaluation records.
    """

    def __init__(self, output_dir, metric, minimize, patience, save, workers=1):
        """metric, minimize, patience: eval_early_stopping_metric, _minimize and
        _steps (0: never stop early). save: writes a checkpoint of the current
        step and returns its path (TrainerSetup.save), for a best evaluation that fell
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
            for r in run_files.read_metrics(self.output_dir)
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
        (outputs/best.py); returns the fields every metrics.jsonl record gains:
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
                        for name in (run_files.HPARAMS_FILE, run_files.RUN_FILE)
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
