"""Loading a trained model for decoding: the run's hparams, problem, and checkpoint.

A run directory records everything needed to rebuild its model (hparams.json, and
run.json with the problem, model and vocabulary fingerprint), so loading a run needs
no hparams_set/hparams (`t2t-decoder --output_dir=RUN`). When they are given anyway
(T2T habit), they must agree with the run: a model rebuilt with other hparams would
not match its checkpoint, or worse, would load and translate with the wrong settings.
"""

import json
import os

import tensorflow as tf

from t2t_lite import registry
from t2t_lite.errors import UserError, first_line
from t2t_lite.hparams import HParams, HParamsError
from t2t_lite.hparams_checks import validate
from t2t_lite.hparams_sets import with_new_keys_at_defaults
from t2t_lite.models.factory import build_model
from t2t_lite.outputs.checkpoints import (
    checkpoint_prefix,
    checkpoints_on_disk,
    restore_newest_readable,
)
from t2t_lite.outputs.run_files import HPARAMS_FILE, RUN_FILE


def _read_json(path, what):
    try:
        with open(path) as f:
            return f.read() if what == "hparams" else json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is unreadable ({e}).") from None


# Hparams that shape the model's weights: a given hparams_set must agree
# with the run on these. Others (batching, learning rate, dropout) do not matter when
# decoding and may differ, e.g. after a resume that changed the learning rate.
ARCHITECTURE_KEYS = (
    "hidden_size",
    "filter_size",
    "num_hidden_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "num_heads",
    "shared_embedding_and_softmax_weights",
    "norm_epsilon",
)


def run_hparams(run_dir, hparams_set, overrides, model="transformer"):
    """The run's stored hparams with `overrides` (the hparams argument) applied on
    top, range-checked once. A hparams_set given too must agree with the run on
    ARCHITECTURE_KEYS; without a stored hparams.json it is the only source."""
    path = os.path.join(run_dir, HPARAMS_FILE)
    if not os.path.exists(path):
        if not hparams_set:
            raise UserError(
                f"no {HPARAMS_FILE} in '{run_dir}': give the hparams_set (and "
                "hparams) the model was trained with."
            )
        return validate(
            registry.HPARAMS_SETS.get(hparams_set)().parse(overrides), model
        )
    try:
        stored = HParams.from_json(_read_json(path, "hparams"))
    except HParamsError as e:
        raise UserError(f"{path}: {e}") from None
    stored, _ = with_new_keys_at_defaults(stored)  # a run of an older version
    hp = validate(stored.copy().parse(overrides), model)
    if hparams_set:
        given = registry.HPARAMS_SETS.get(hparams_set)().parse(overrides)
        differing = [k for k in ARCHITECTURE_KEYS if k in given.diff(stored)]
        if differing:
            details = ", ".join(
                f"{k}={stored.values().get(k)!r} (given {given.values().get(k)!r})"
                for k in differing
            )
            raise UserError(
                f"the run in '{run_dir}' was trained with other hparams: {details}; "
                "give no hparams_set/hparams to use the run's own."
            )
    return hp


def _stored_run(run_dir):
    """run.json's contents ({} without one)."""
    path = os.path.join(run_dir, RUN_FILE)
    stored = _read_json(path, "run") if os.path.exists(path) else {}
    if not isinstance(stored, dict):
        raise UserError(f"{path} is not a JSON object; restore it from the run.")
    return stored


def run_identity(run_dir, problem, model):
    """(problem, model, vocab_fingerprint or None) from run.json and the arguments
    (either may be empty: the run's; both given: they must agree)."""
    stored = _stored_run(run_dir)
    names = {}
    for key, given in (("problem", problem), ("model", model)):
        value = stored.get(key)
        if given and value and given != value:
            raise UserError(
                f"the run in '{run_dir}' is {key} {value!r}, not {key}={given!r}."
            )
        names[key] = given or value
        if not names[key]:
            raise UserError(f"{key} is required (no {RUN_FILE} in '{run_dir}').")
    return names["problem"], names["model"], stored.get("vocab_fingerprint")


def restore_model(model, checkpoint_path, run_dir):
    """Restores the model's weights only (not the optimizer); returns the path.

    checkpoint_path: a prefix such as RUN/model-2000, or "" for the newest readable
    checkpoint in run_dir (a damaged newest one is skipped with a warning)."""
    candidates = (
        [checkpoint_path]
        if checkpoint_path
        else [p for _, p in reversed(checkpoints_on_disk(run_dir))]
    )
    if not candidates:
        raise UserError(
            f"no checkpoint in '{run_dir}': train first, or give checkpoint_path."
        )
    if checkpoint_path and not tf.io.gfile.exists(checkpoint_path + ".index"):
        raise UserError(
            f"checkpoint_path '{checkpoint_path}': no checkpoint there "
            f"({checkpoint_path}.index missing)."
        )
    checkpoint = tf.train.Checkpoint(model=model)

    def restore(path):
        checkpoint.restore(path).expect_partial().assert_existing_objects_matched()

    try:
        return restore_newest_readable(restore, candidates, run_dir)
    except AssertionError as e:  # weights of this model missing from the checkpoint
        raise UserError(
            f"cannot load checkpoint {e.path} into this model: it lacks some of the "
            "model's weights (another model's checkpoint, or one written by "
            "t2t_lite before every layer was saved under model/: resuming it once "
            "with t2t-trainer writes a complete one)."
        ) from None
    except (tf.errors.OpError, ValueError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(
            f"cannot load checkpoint {e.path} into this model: {first_line(e)[:300]}"
        ) from None


def open_for_decoding(
    *,
    output_dir="",
    checkpoint_path="",
    problem="",
    model="",
    hparams_set="",
    hparams="",
    data_dir="",
):
    """The run's (model class, problem, hp, run_dir, checkpoint_path) without
    building the model: what an engine that does not run the checkpoint (a
    CTranslate2 conversion of it) needs."""
    if not output_dir and not checkpoint_path:
        raise UserError("give output_dir (the run) or checkpoint_path.")
    if checkpoint_path and os.path.isdir(checkpoint_path):  # a run dir: its newest
        output_dir, checkpoint_path = checkpoint_path, ""
    # RUN/model-2000.index or .data-00000-of-00001 name the checkpoint RUN/model-2000.
    checkpoint_path = checkpoint_prefix(checkpoint_path)
    run_dir = output_dir or os.path.dirname(checkpoint_path) or "."
    if not os.path.isdir(run_dir):
        state = "is not a directory" if os.path.exists(run_dir) else "does not exist"
        what = "output_dir" if output_dir else "the directory of checkpoint_path"
        raise UserError(f"{what} '{run_dir}' {state}.")
    stored_model = _stored_run(run_dir).get("model") if not model else None
    hp = run_hparams(
        run_dir, hparams_set, hparams, model or stored_model or "transformer"
    )
    problem_name, model_name, fingerprint = run_identity(run_dir, problem, model)
    the_problem = registry.PROBLEMS.get(problem_name)()
    the_problem.load(data_dir or None)
    if fingerprint and fingerprint != the_problem.vocab_fingerprint():
        raise UserError(
            f"the vocabulary in data_dir '{data_dir}' is not the one the run in "
            f"'{run_dir}' was trained with; give the run's data_dir."
        )
    model_class = registry.MODELS.get(model_name)
    return model_class, the_problem, hp, run_dir, checkpoint_path


def load_for_decoding(**run):
    """Returns (model, problem, hp, checkpoint path) ready to decode; `run` as
    open_for_decoding's."""
    model_class, problem, hp, run_dir, checkpoint_path = open_for_decoding(**run)
    the_model = build_model(model_class, hp, problem.vocab_size)
    path = restore_model(the_model, checkpoint_path, run_dir)
    return the_model, problem, hp, path
