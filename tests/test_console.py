"""A quiet, informative console: TensorFlow's start-up and
per-save lines hidden unless T2T_LITE_TF_LOGS=1; the gradient norm and clipped
updates in the log line and TensorBoard; hparams on the HParams dashboard;
flags.txt; an older checkpoint without the clipped-updates counter still resumes."""

import glob
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.accumulation_helpers import build, run, tiny_hparams, uneven_micro_batches
from support.cli_helpers import finish_cli, start_cli, tiny_trainer_flags

from t2t_lite.models.losses import token_loss
from t2t_lite.outputs.checkpoints import CheckpointKeeper
from t2t_lite.training.opening.build import build_training
from t2t_lite.training.reporting.progress import ThroughputMeter, format_seconds
from t2t_lite.training.reporting.reporter import grad_norm_text
from t2t_lite.training.step.train_step import OPTIONAL_CHECKPOINT_ITEMS

# What TensorFlow prints on this kind of machine unless told not to (the CUDA and
# oneDNN lines depend on the machine; "Sharding callback" on TF's Python code).
NOISE = (
    "oneDNN custom operations",
    "cpu_feature_guard",
    "cuda",
    "absl::InitializeLog",
    "Sharding callback",
)


def _reference_norm(model, batches):
    """Global norm of d(sum of token losses of `batches`) / (their tokens), by hand."""
    total, tokens = None, 0.0
    for batch in batches:
        batch = {k: tf.constant(v) for k, v in batch.items()}
        with tf.GradientTape() as tape:
            logits = model(batch, training=True)
            loss_sum, count = token_loss(logits, batch["targets"], 0.0)
        grads = [
            tf.convert_to_tensor(g)
            for g in tape.gradient(loss_sum, model.trainable_variables)
        ]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
        tokens += float(count)
    return float(tf.linalg.global_norm([g / tokens for g in total]))


def test_grad_norm_is_the_updates_norm_before_clipping_and_clips_are_counted():
    """n=2 on micro-batches of different token counts: each update reports the
    norm of the accumulated, token-normalized gradient (computed here by hand)
    before clipping; clipped_updates counts the updates whose norm exceeded it."""
    keras.utils.set_random_seed(11)
    start = build(tiny_hparams(label_smoothing=0.0), 4)[0].get_weights()
    micro = uneven_micro_batches(4, seed=3)
    probe, _ = build(tiny_hparams(label_smoothing=0.0), 4, initial_weights=start)
    first = _reference_norm(probe, micro[:2])
    clip = first / 2  # the first update is clipped
    hp = tiny_hparams(
        label_smoothing=0.0, optimizer_multistep_accumulate_steps=2, clip_grad_norm=clip
    )
    model, step = build(hp, 4, initial_weights=start)
    norms, expected = [], []
    for update in range(2):
        window = micro[2 * update : 2 * update + 2]
        expected.append(_reference_norm(model, window))
        run(step, window[:1], start=2 * update)
        features = {k: tf.constant(v) for k, v in window[1].items()}
        out = step.train_on(features, closes_window=True)
        norms.append(float(out["grad_norm"][0]))
    np.testing.assert_allclose(norms, expected, rtol=1e-5)
    assert expected[0] > clip
    clipped = int(tf.convert_to_tensor(step.clipped_updates))
    assert clipped == 1 + (expected[1] > clip)


def test_no_clip_counts_nothing_and_the_log_text_says_so():
    assert (
        grad_norm_text(1.23456, 4, clip_grad_norm=1.0) == ", grad norm 1.23 (4 clipped)"
    )
    assert grad_norm_text(1.23456, 0, clip_grad_norm=0.0) == ", grad norm 1.23"
    assert grad_norm_text(None, 0, clip_grad_norm=1.0) == ""


def test_eta_reads_as_hours_and_says_when_train_steps_is_out_of_reach():
    assert format_seconds(3725.9) == "1:02:05"
    assert format_seconds(30 * 86400) == "720:00:00"
    # A run stopped by a clock sets train_steps out of reach: no nine-digit hours.
    assert format_seconds(1e15) == "over 365 days"
    assert format_seconds(math.inf) == "?"


def test_meter_reports_the_mean_finite_grad_norm_since_the_last_line():
    meter = ThroughputMeter(0, 10)
    for norm in (1.0, math.inf, 3.0):
        meter.add(
            {
                "loss_sum": (1.0,),
                "tokens": (1.0,),
                "window_loss_sum": (1.0,),
                "window_tokens": (1.0,),
                "grad_norm": (norm,),
            }
        )
    meter.take()
    assert meter.grad_norm == 2.0
    meter.add({"loss_sum": (1.0,), "tokens": (1.0,)})  # no update since
    meter.take()
    assert meter.grad_norm is None


def test_a_checkpoint_without_clipped_updates_still_restores(tmp_path):
    """A checkpoint written before clipped_updates existed restores, the counter at
    its initial 0; without declaring it optional the restore is refused (control)."""
    hp = tiny_hparams(clip_grad_norm=1.0)
    old = build_training(hp, vocab_size=12, train_steps=4)
    old.step.global_step.assign(7)
    items = dict(old.step.checkpoint_items())
    del items["clipped_updates"]
    written = tf.train.Checkpoint(**items, train_replicas=old.replicas_variable)
    tf.train.CheckpointManager(
        written, str(tmp_path), max_to_keep=1, checkpoint_name="model"
    ).save(checkpoint_number=7)
    new = build_training(hp, vocab_size=12, train_steps=4)
    new.step.clipped_updates.assign(0)
    keeper = CheckpointKeeper(
        new.checkpoint(),
        str(tmp_path),
        5,
        new.model.trainable_variables,
        optional=OPTIONAL_CHECKPOINT_ITEMS,
    )
    assert keeper.restore_newest_readable() == str(tmp_path / "model-7")
    assert new.step.micro_step == 7
    assert int(tf.convert_to_tensor(new.step.clipped_updates)) == 0
    assert hasattr(keeper.checkpoint, "clipped_updates")  # saved from now on
    strict = CheckpointKeeper(
        build_training(hp, vocab_size=12, train_steps=4).checkpoint(),
        str(tmp_path),
        5,
        new.model.trainable_variables,
    )
    with pytest.raises(Exception, match="cannot restore checkpoint"):
        strict.restore_newest_readable()


def _events(directory):
    """{tag: [values]} and the plugin names of the event files in `directory`."""
    tags, plugins = {}, set()
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                plugins.add(value.metadata.plugin_data.plugin_name)
                tensor = (
                    tf.make_ndarray(value.tensor) if value.HasField("tensor") else None
                )
                tags.setdefault(value.tag, []).append(tensor)
    return tags, plugins


@pytest.fixture(scope="module")
def quiet_and_loud(tmp_path_factory):
    """The same 4-update run twice as subprocesses (in parallel): by default and
    with T2T_LITE_TF_LOGS=1."""
    root = tmp_path_factory.mktemp("console")
    flags = [
        *tiny_trainer_flags("algorithmic_reverse"),
        "--train_steps=4",
        "--save_checkpoints_steps=2",
        "--hparams=clip_grad_norm=1e-4",
    ]
    quiet = start_cli("trainer", *flags, f"--output_dir={root / 'quiet'}", fresh=True)
    os.environ["T2T_LITE_TF_LOGS"] = "1"
    try:
        loud = start_cli("trainer", *flags, f"--output_dir={root / 'loud'}", fresh=True)
    finally:
        del os.environ["T2T_LITE_TF_LOGS"]
    return root, finish_cli(quiet), finish_cli(loud)


@pytest.mark.slow
def test_tensorflow_noise_is_hidden_unless_asked_for(quiet_and_loud):
    _, quiet, loud = quiet_and_loud
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    for line in quiet.stderr.splitlines():
        assert not any(noise in line for noise in NOISE), line
    assert "Saved checkpoint" in quiet.stderr
    assert "Sharding callback" in loud.stderr  # two saves, TF's Python logging
    shown = [noise for noise in NOISE if noise in loud.stderr]
    assert len(shown) >= 2, loud.stderr[:3000]


@pytest.mark.slow
def test_grad_norm_and_clips_reach_the_log_and_tensorboard(quiet_and_loud):
    root, quiet, _ = quiet_and_loud
    assert "step 2, update 2, loss " in quiet.stderr
    assert ", grad norm " in quiet.stderr
    assert "(2 clipped)" in quiet.stderr and "(4 clipped)" in quiet.stderr
    tags, plugins = _events(str(root / "quiet" / "train"))
    assert [int(v) for v in tags["clipped_updates"]] == [2, 4]
    assert (
        all(float(v) > 1e-4 for v in tags["grad_norm"]) and len(tags["grad_norm"]) == 2
    )
    assert "hparams" in plugins  # the HParams dashboard's session record


@pytest.mark.slow
def test_flags_txt_lists_every_flag_and_repeats_the_command(quiet_and_loud):
    root = quiet_and_loud[0]
    out = root / "quiet"
    assert (out / "hparams.json").exists()
    lines = (out / "flags.txt").read_text().splitlines()
    for expected in (
        "--train_steps=4",
        "--hparams=clip_grad_norm=1e-4",
        "--hparams_set=transformer_test",
        f"--output_dir={out}",
        "--keep_checkpoint_max=20",  # defaults too
        "--eval_early_stopping_metric=loss",
    ):
        assert expected in lines, (expected, lines)


@pytest.mark.slow
def test_a_user_set_tf_cpp_min_log_level_is_kept():
    """The CLI default (1, C++ INFO hidden) is only a default; the quiet runs above
    show the default at work."""
    code = (
        "import os, sys; sys.argv = ['t2t-trainer']; "
        "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '0'; import t2t_lite; "
        "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "T2T_LITE_TF_LOGS"}
    kept = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert kept.stdout.strip() == "0", kept.stderr[-2000:]
