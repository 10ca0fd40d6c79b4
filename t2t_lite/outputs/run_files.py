"""The output directory of a run: its hparams.json guard and its metrics.jsonl log.

Layout (T2T-like):
  OUTPUT_DIR/hparams.json          hparams of the run (refuses a restart with others)
  OUTPUT_DIR/run.json              problem, model and vocabulary fingerprint of the run
  OUTPUT_DIR/checkpoint, model-N.* tf.train.CheckpointManager files
  OUTPUT_DIR/metrics.jsonl         one JSON line per evaluation
  OUTPUT_DIR/train/, eval/         TensorBoard event files
  OUTPUT_DIR/workers/worker-I/     checkpoints of worker I > 0 of a multi-host run
                                   (their own input positions; the chief's are above)
"""

import json
import os

import tensorflow as tf
from absl import logging

from t2t_lite.errors import UserError
from t2t_lite.fileio import append_line, write_atomically
from t2t_lite.hparams import HParams, HParamsError
from t2t_lite.hparams_sets import with_new_keys_at_defaults
from t2t_lite.outputs.checkpoints import checkpoints_on_disk

HPARAMS_FILE = "hparams.json"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"


# Hparams a resumed run may change (with a warning): the remedies for a diverging or
# stalled run. Everything else (shapes, the optimizer, n, the data) would make the
# checkpoint series mean something else.
CHANGEABLE_ON_RESUME = frozenset(
    {
        "learning_rate_schedule",
        "learning_rate_constant",
        "learning_rate_warmup_steps",
        "learning_rate_decay_steps",
        "learning_rate_decay_rate",
        "learning_rate_decay_staircase",
        "clip_grad_norm",
        "max_consecutive_bad_updates",
    }
)


def worker_checkpoint_dir(output_dir, worker):
    """Where worker `worker` (0: the chief) of a run keeps its checkpoints."""
    if worker == 0:
        return output_dir
    return os.path.join(output_dir, "workers", f"worker-{worker}")


def _has_checkpoint(output_dir):
    return bool(checkpoints_on_disk(output_dir))


def _read_text(path):
    with tf.io.gfile.GFile(path) as f:
        return f.read()


def prepare_output_dir(output_dir, hp):
    """Creates output_dir and stores hp, or checks hp against the stored run's.

    Restarting into a directory whose run used other hparams would silently mix two
    experiments in one checkpoint series; it is an error naming the differing keys,
    except for CHANGEABLE_ON_RESUME keys (warned about), and except when the earlier
    run never wrote a checkpoint (nothing to mix).
    """
    try:
        tf.io.gfile.makedirs(output_dir)
    except (OSError, tf.errors.OpError) as e:
        reason = getattr(e, "strerror", None) or getattr(e, "message", str(e))
        raise UserError(
            f"output_dir '{output_dir}' cannot be created: {reason}."
        ) from None
    check_hparams(output_dir, hp)
    write_atomically(os.path.join(output_dir, HPARAMS_FILE), hp.to_json() + "\n")


def check_hparams(output_dir, hp):
    """prepare_output_dir's check alone, writing nothing: for what must refuse a
    run before anything of it is written (batch_size=0's probe comes first)."""
    path = os.path.join(output_dir, HPARAMS_FILE)
    if tf.io.gfile.exists(path) and _has_checkpoint(output_dir):
        _check_stored_hparams(path, output_dir, hp)


def _check_stored_hparams(path, output_dir, hp):
    try:
        stored = HParams.from_json(_read_text(path))
    except (OSError, tf.errors.OpError, HParamsError) as e:
        raise UserError(f"{path}: {e}") from None
    stored, added = with_new_keys_at_defaults(stored)
    differing = hp.diff(stored)
    fixed = [k for k in differing if k not in CHANGEABLE_ON_RESUME]
    details = ", ".join(
        f"{k}={stored.values().get(k)!r}→{hp.values().get(k)!r}"
        for k in (fixed or differing)[:5]
    )
    newer = [k for k in fixed if k in added]
    if newer:
        raise UserError(
            f"output_dir '{output_dir}' holds a run from before hparam(s) "
            f"{', '.join(newer)} existed; it trained as "
            f"{', '.join(f'{k}={stored.values()[k]!r}' for k in newer)} (the "
            "default): resume with that value or use a new output_dir."
        )
    if added:
        logging.info(
            "%s predates hparam(s) %s; the run resumes with their defaults.",
            path,
            ", ".join(added),
        )
    if fixed:
        raise UserError(
            f"output_dir '{output_dir}' holds a run with different hparams "
            f"({details}); use a new output_dir or the same hparams."
        )
    if differing:
        logging.warning("Resuming with changed hparams: %s.", details)


def check_run_identity(output_dir, identity, hints=None):
    """Stores {problem, model, vocab_fingerprint, ...} or checks it against the stored one.

    A checkpoint trained with one vocabulary (or model) must not be continued with
    another: the ids would silently mean different tokens. A key the stored file
    lacks (written by an older version) is added, not refused. hints: {key: text}
    ending the refusal of that key instead of "; use a new output_dir."
    """
    path = os.path.join(output_dir, RUN_FILE)
    if not tf.io.gfile.exists(path):
        write_atomically(path, json.dumps(identity, indent=2, sort_keys=True) + "\n")
        return
    try:
        stored = json.loads(_read_text(path))
    except (OSError, tf.errors.OpError, json.JSONDecodeError) as e:
        raise UserError(
            f"{path} is unreadable ({e}); restore it or use a new output_dir."
        ) from None
    for key, value in identity.items():
        if key in stored and stored[key] != value:
            advice = (hints or {}).get(key) or "; use a new output_dir."
            raise UserError(
                f"output_dir '{output_dir}' holds a run with {key} "
                f"{stored.get(key)!r}, not {value!r}{advice}"
            )
    if not set(identity) <= set(stored):
        updated = {**stored, **identity}
        write_atomically(path, json.dumps(updated, indent=2, sort_keys=True) + "\n")


def append_metrics(output_dir, record):
    """Appends one evaluation's metrics as a JSON line."""
    append_line(
        os.path.join(output_dir, METRICS_FILE), json.dumps(record, sort_keys=True)
    )


def read_metrics(output_dir):
    """The records of metrics.jsonl, oldest first ([] without one; a damaged line,
    e.g. the half-written last one of a killed run, is skipped)."""
    path = os.path.join(output_dir, METRICS_FILE)
    if not tf.io.gfile.exists(path):
        return []
    records = []
    for line in _read_text(path).splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_run_file(output_dir):
    """run.json's content, or {} when there is none or it is unreadable
    (check_run_identity reports an unreadable run.json)."""
    path = os.path.join(output_dir, RUN_FILE)
    try:
        stored = json.loads(_read_text(path)) if tf.io.gfile.exists(path) else {}
    except (OSError, tf.errors.OpError, json.JSONDecodeError):
        return {}
    return stored if isinstance(stored, dict) else {}


def record_train_steps(output_dir, train_steps):
    """Stores train_steps in run.json; returns the value stored before (None if
    none). Not part of the run's identity: a resume may change it."""
    path = os.path.join(output_dir, RUN_FILE)
    try:
        stored = json.loads(_read_text(path)) if tf.io.gfile.exists(path) else {}
    except (OSError, tf.errors.OpError, json.JSONDecodeError):
        return None  # check_run_identity reports an unreadable run.json
    previous = stored.get("train_steps")
    if previous != train_steps:
        stored["train_steps"] = train_steps
        write_atomically(path, json.dumps(stored, indent=2, sort_keys=True) + "\n")
    return previous
