"""The best checkpoint of a run by one evaluation metric, and early stopping on it.

T2T's flags choose the metric (`eval_early_stopping_metric`: loss, accuracy,
sequence_accuracy or bleu; `eval_early_stopping_metric_minimize`, by default True
for loss only) and stop a run whose metric has not improved for
`eval_early_stopping_steps` global steps. The best checkpoint is kept whether or not
early stopping is on, the way OpenNMT-tf's "export best" and fairseq's
`checkpoint_best.pt` keep it: apart from the rolling checkpoints, in its own
directory, so `keep_checkpoint_max` never deletes it.

Layout of OUTPUT_DIR/best/:
  model-N.index, model-N.data-*  the checkpoint written at step N, the step of the
                                 best evaluation so far: hard links to OUTPUT_DIR's
                                 files (no copy; the manager deletes only its own
                                 names), copies where links are impossible
  checkpoint                     a state file naming model-N (tf.train tools)
  hparams.json, run.json         the run's, so t2t-decoder --checkpoint_path=
                                 OUTPUT_DIR/best/model-N works on its own
  best.json                      {metric, minimize, value, global_step,
                                 update_step, checkpoint}: a resumed run recovers
                                 the best so far from it
Only one best checkpoint exists at a time; an improvement replaces it.
"""

import json
import math
import os

import tensorflow as tf
from absl import logging

from t2t_lite.constants import EVAL_METRICS
from t2t_lite.errors import UserError
from t2t_lite.fileio import write_atomically

BEST_DIR = "best"
BEST_FILE = "best.json"


def default_minimize(metric):
    """Loss is minimized; accuracies and BLEU are maximized."""
    return metric == "loss"


def check_metric(metric, bleu_available):
    """One-line UserError for a metric name evaluation does not report."""
    if metric not in EVAL_METRICS:
        raise UserError(
            f"eval_early_stopping_metric must be one of {', '.join(EVAL_METRICS)}, "
            f"got {metric!r}."
        )
    if metric == "bleu" and not bleu_available:
        raise UserError(
            "eval_early_stopping_metric=bleu needs BLEU at evaluation: a "
            "translation problem and eval_bleu_sentences != 0."
        )


class BestCheckpoint:
    """Tracks the best evaluation of a run by `metric` and keeps its checkpoint.

    The chief calls `improves(record)` on each evaluation, `keep(record, prefix)`
    when it does (prefix: the checkpoint of that very step), and adds `fields()`
    to the record it logs.
    """

    def __init__(self, output_dir, metric="loss", minimize=None):
        self.output_dir = output_dir
        self.directory = os.path.join(output_dir, BEST_DIR)
        self.metric = metric
        self.minimize = default_minimize(metric) if minimize is None else minimize
        self.best = None  # {"value", "global_step", "update_step", "checkpoint"}

    def recover(self, restored_step):
        """Takes the best so far from best.json when it was chosen by the same
        metric and direction at or before `restored_step` (a run resumed from an
        older checkpoint forgets a best from its abandoned future)."""
        path = os.path.join(self.directory, BEST_FILE)
        if not tf.io.gfile.exists(path):
            return
        try:
            with tf.io.gfile.GFile(path) as f:
                stored = json.load(f)
            same = (stored["metric"], stored["minimize"]) == (
                self.metric,
                self.minimize,
            )
            if same and stored["global_step"] <= restored_step:
                self.best = {
                    k: stored[k] for k in ("value", "global_step", "update_step")
                }
                # Where best/ is now: a run moved or copied elsewhere must not
                # name its best checkpoint at the old place.
                self.best["checkpoint"] = os.path.join(
                    self.directory, os.path.basename(stored["checkpoint"])
                )
                return
        except (OSError, tf.errors.OpError, ValueError, KeyError, TypeError) as e:
            logging.warning("Ignoring unreadable %s (%s).", path, e)
            return
        logging.info(
            "%s holds the best by %s %s at step %d; this run keeps the best by %s "
            "%s from now on.",
            path,
            "min" if stored["minimize"] else "max",
            stored["metric"],
            stored["global_step"],
            "min" if self.minimize else "max",
            self.metric,
        )

    def improves(self, record):
        value = record.get(self.metric)
        if value is None or not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.minimize:
            return value < self.best["value"]
        return value > self.best["value"]

    def steps_without_improvement(self, global_step):
        if self.best is None:
            return 0
        return global_step - self.best["global_step"]

    def keep(self, record, prefix, companions=()):
        """Makes checkpoint `prefix` (of record's step) the best; removes the
        previous best. companions: paths copied next to it (hparams.json, run.json)."""
        tf.io.gfile.makedirs(self.directory)
        name = os.path.basename(prefix)
        kept = os.path.join(self.directory, name)
        sources = tf.io.gfile.glob(prefix + ".*")
        for source in sources:
            _link_or_copy(
                source, os.path.join(self.directory, os.path.basename(source))
            )
        for path in companions:
            if tf.io.gfile.exists(path):
                tf.io.gfile.copy(
                    path,
                    os.path.join(self.directory, os.path.basename(path)),
                    overwrite=True,
                )
        write_atomically(
            os.path.join(self.directory, "checkpoint"),
            f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n',
        )
        self.best = {
            "value": record[self.metric],
            "global_step": record["global_step"],
            "update_step": record["update_step"],
            "checkpoint": kept,
        }
        stored = {"metric": self.metric, "minimize": self.minimize, **self.best}
        write_atomically(
            os.path.join(self.directory, BEST_FILE),
            json.dumps(stored, indent=2, sort_keys=True) + "\n",
        )
        self._remove_others(name)
        return kept

    def _remove_others(self, name):
        for path in tf.io.gfile.glob(os.path.join(self.directory, "model-*")):
            if not os.path.basename(path).startswith(name + "."):
                tf.io.gfile.remove(path)

    def fields(self):
        """What every metrics.jsonl record says of the best so far."""
        if self.best is None:
            return {}
        return {
            "best_checkpoint": self.best["checkpoint"],
            f"best_{self.metric}": self.best["value"],
            "best_global_step": self.best["global_step"],
        }

    def describe(self):
        """'PATH (loss 1.2300 at step N)', or None before any evaluation."""
        if self.best is None:
            return None
        return (
            f"{self.best['checkpoint']} ({self.metric} {self.best['value']:.4f} at "
            f"step {self.best['global_step']})"
        )


def _link_or_copy(source, target):
    if tf.io.gfile.exists(target):
        tf.io.gfile.remove(target)
    try:
        os.link(source, target)  # local file systems: no copy
    except OSError:  # another device, a remote file system (gs://): copy
        tf.io.gfile.copy(source, target, overwrite=True)
