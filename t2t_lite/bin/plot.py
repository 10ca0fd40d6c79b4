"""t2t-plot: learning curves of one or more runs in one figure (a PNG).

    t2t-plot --output_dir=runs/fake8,runs/big,runs/small --plot_file=curves.png \\
      --labels="fake GPU (b n=8),big batch (8b),small batch (b)"

One row per metric (loss, accuracy, BLEU when a run has it, the gradient noise scale
when it was measured), plotted against updates (left), against target tokens trained
on (middle, for runs that record them) and against training time (right), every run
on the same axes. The training curves come from the run's TensorBoard train/ events
(thin, faint line), the dev metrics from its metrics.jsonl (solid line with dots).
Against tokens, a run whose batch grows (batch_size_schedule) and a fixed-batch run
compare by the data they consumed.

Compare runs with different accumulation steps n against *updates*: a fake-GPU run
(micro-batch b, n=8) and a big-batch run (8b, n=1) apply the same number of updates
computed from the same number of tokens, so their curves should track each other
there (up to dropout and how the data falls into batches); against micro-steps
(global_step) the fake-GPU run would look 8 times slower.
"""

import io
import os

import tensorflow as tf
from absl import flags

from t2t_lite.bin import common
from t2t_lite.errors import UserError, first_line
from t2t_lite.fileio import write_atomically
from t2t_lite.outputs import curves

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "output_dir",
    None,
    "Run directories (t2t-trainer --output_dir), comma-separated; each one is a "
    "curve on every panel, drawn against updates (optimizer steps) and against "
    "training time. Compare runs with different accumulation steps n on updates: "
    "a fake-GPU run (micro-batch b, n=8) and a big-batch run (8b, n=1) make "
    "updates from the same number of tokens, so their curves should track each "
    "other there (against micro-steps the fake-GPU run would look 8 times slower).",
)
flags.DEFINE_string(
    "plot_file",
    "",
    "The figure to write, e.g. curves.png (.pdf and .svg work too); its directory is "
    "created if missing.",
)
flags.DEFINE_list(
    "labels",
    None,
    "Legend labels, comma-separated (so none may hold a comma), one per "
    "--output_dir (default: each run directory's base name).",
)
flags.DEFINE_list(
    "metrics",
    ["loss", "accuracy", "bleu", "noise_scale"],
    f"Rows of the figure, from {', '.join(curves.CURVES)}. A metric no run "
    "has (BLEU of an algorithmic problem, the noise scale of a run without "
    "accumulation) is left out.",
)

_TITLES = {
    "loss": "loss per token",
    "accuracy": "token accuracy",
    "sequence_accuracy": "sequence accuracy",
    "bleu": "BLEU",
    "noise_scale": "noise scale (tokens)",
    "tokens_per_update": "tokens per update",
}
_LOG_SCALE = ("loss", "noise_scale")


def _check_flags():
    """(run dirs, labels, metrics, format) from the flags, or a UserError."""
    runs = [d for d in FLAGS.output_dir or [] if d.strip()]
    if not runs:
        raise UserError("--output_dir is required: one or more run directories.")
    if not FLAGS.plot_file:
        raise UserError("--plot_file is required, e.g. --plot_file=curves.png.")
    labels = FLAGS.labels or [os.path.basename(os.path.normpath(d)) for d in runs]
    if len(labels) != len(runs):
        raise UserError(
            f"--labels has {len(labels)} label(s) but --output_dir has "
            f"{len(runs)} run(s); give one label per run."
        )
    unknown = [m for m in FLAGS.metrics if m not in curves.CURVES]
    if unknown or not FLAGS.metrics:
        raise UserError(
            f"--metrics: unknown metric '{(unknown or [''])[0]}'; choose from "
            f"{', '.join(curves.CURVES)}."
        )
    return runs, labels, list(dict.fromkeys(FLAGS.metrics)), _plot_format()


def _plot_format():
    from matplotlib.figure import Figure  # here, not at the top: only t2t-plot needs it

    supported = Figure().canvas.get_supported_filetypes()
    extension = os.path.splitext(FLAGS.plot_file)[1].lstrip(".").lower()
    if extension not in supported:
        raise UserError(
            f"--plot_file '{FLAGS.plot_file}': unknown image format "
            f"'{extension or '(no extension)'}'; end it with .png, .pdf or .svg."
        )
    return extension


def _time_unit(runs):
    """("s", 1), ("min", 60) or ("h", 3600), whichever suits the longest run."""
    longest = max(
        (
            s
            for run in runs
            for curve in [*run.train.values(), *run.dev.values()]
            for s in curve.seconds
            if s is not None
        ),
        default=0.0,
    )
    if longest > 3 * 3600:
        return "h", 3600.0
    return ("min", 60.0) if longest > 300 else ("s", 1.0)


def _plot_known(ax, xs, values, color, style):
    """Plots the points whose x is known (not None)."""
    known = [(x, v) for x, v in zip(xs, values) if x is not None]
    if known:
        ax.plot([x for x, _ in known], [v for _, v in known], color=color, **style)


def _draw(axes_row, curve, color, unit, with_tokens, **style):
    """Draws one curve against updates, tokens trained on (with_tokens) and time."""
    axes_row[0].plot(curve.updates, curve.values, color=color, **style)
    if with_tokens:
        _plot_known(axes_row[1], curve.tokens, curve.values, color, style)
    seconds = [s / unit if s is not None else None for s in curve.seconds]
    _plot_known(axes_row[-1], seconds, curve.values, color, style)


def _has_tokens(runs):
    return any(
        t is not None
        for run in runs
        for curve in [*run.train.values(), *run.dev.values()]
        for t in curve.tokens
    )


def _figure(runs, labels, metrics):
    """The matplotlib Figure: a row per metric, columns updates, tokens (when
    recorded) and time."""
    from matplotlib.figure import Figure  # here, not at the top: only t2t-plot needs it
    from matplotlib.lines import Line2D

    unit_name, unit = _time_unit(runs)
    with_tokens = _has_tokens(runs)
    x_labels = ["updates (optimizer steps)", f"training time ({unit_name})"]
    if with_tokens:
        x_labels.insert(1, "target tokens trained on")
    figure = Figure(
        figsize=(6 * len(x_labels), 3.4 * len(metrics) + 0.8), layout="constrained"
    )
    axes = figure.subplots(len(metrics), len(x_labels), squeeze=False)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    dev_style = {"linewidth": 1.8, "marker": "o", "markersize": 3}
    train_style = {"linewidth": 0.9, "alpha": 0.45}
    for row, metric in zip(axes, metrics):
        for run, color in zip(runs, colors):
            if metric in run.train:
                _draw(row, run.train[metric], color, unit, with_tokens, **train_style)
            if metric in run.dev:
                _draw(row, run.dev[metric], color, unit, with_tokens, **dev_style)
        for ax, x in zip(row, x_labels):
            ax.set_xlabel(x)
            ax.set_ylabel(_TITLES[metric])
            ax.grid(True, alpha=0.3)
            if metric in _LOG_SCALE:
                ax.set_yscale("log")
    handles = [Line2D([], [], color=c, linewidth=2) for c in colors]
    handles += [
        Line2D([], [], color="gray", **dev_style),
        Line2D([], [], color="gray", **train_style),
    ]
    names = [*labels, "dev (metrics.jsonl)", "train (TensorBoard)"]
    figure.legend(handles, names, loc="outside upper center", ncol=min(len(names), 5))
    return figure


def _save(figure, path, image_format):
    buffer = io.BytesIO()
    figure.savefig(buffer, format=image_format, dpi=100)
    parent = os.path.dirname(path)
    try:
        if parent:
            os.makedirs(parent, exist_ok=True)
        write_atomically(path, buffer.getvalue())
    except (OSError, tf.errors.OpError) as e:
        raise UserError(
            f"--plot_file '{path}' cannot be written: {first_line(e)}"
        ) from None


def _summary(run, label):
    loss = run.dev.get("loss")
    if not loss:
        return f"  {label}: no dev evaluations"
    return (
        f"  {label}: {len(loss)} evaluations, final dev loss {loss.values[-1]:.4f} "
        f"at update {loss.updates[-1]} (step {loss.steps[-1]}, n={run.accumulate_steps})"
    )


def main(argv):
    del argv
    run_dirs, labels, metrics, image_format = _check_flags()
    runs = [curves.read_run(d) for d in run_dirs]
    shown = [m for m in metrics if any(m in r.dev or m in r.train for r in runs)]
    if not shown:
        raise UserError(
            f"--output_dir: no run has any of {', '.join(metrics)} yet (no evaluation "
            "in metrics.jsonl, no loss in train/): nothing to plot."
        )
    _save(_figure(runs, labels, shown), FLAGS.plot_file, image_format)
    print(f"Wrote {FLAGS.plot_file}: {', '.join(shown)} of {len(runs)} run(s)")
    for run, label in zip(runs, labels):
        print(_summary(run, label))
    return 0


def run():
    common.run_main(main, "t2t-plot")


if __name__ == "__main__":
    run()
