"""What the trainer tells the user about a run beyond loss and speed: the gradient
norm in the log line, the hparams on TensorBoard's HParams dashboard, and a warning
when a resume changes train_steps (which moves the schedule's linear_decay)."""

import os

from absl import logging

from t2t_lite.runs.checkpoints import checkpoints_on_disk

# Built-in learning-rate factors that read train_steps (optim/schedule.py).
TRAIN_STEPS_FACTORS = ("linear_decay",)


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
