"""t2t-plot and outputs/curves.py: a run's curves read back exactly, and drawn.

Runs are synthetic (a metrics.jsonl and TensorBoard events written here), except one
tiny real t2t-trainer run (marked slow).
"""

import json
import os
import struct

import pytest
import tensorflow as tf
from support.cli_helpers import assert_user_error, run_cli, tiny_trainer_flags
from tensorflow.core.util import event_pb2

from t2t_lite.outputs import curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_run(path, records=(), train=(), evals=(), n=None):
    """A run dir: metrics.jsonl `records`, train/ "loss" events [(step, loss)] and
    eval/ "loss" events [(step, loss)] written with tf.summary, run.json with n."""
    os.makedirs(path, exist_ok=True)
    if n is not None:
        with open(os.path.join(path, "run.json"), "w") as f:
            json.dump({"accumulate_steps": n}, f)
    if records:
        with open(os.path.join(path, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    for name, points in (("train", train), ("eval", evals)):
        if points:
            writer = tf.summary.create_file_writer(os.path.join(path, name))
            with writer.as_default():
                for step, value in points:
                    tf.summary.scalar("loss", value, step=step)
            writer.close()
    return str(path)


def _write_events(path, process, events):
    """An event file of process `process` ("host.pid") with chosen wall times:
    events [(step, wall_time, loss)] (TF1-style simple_value summaries)."""
    os.makedirs(path, exist_ok=True)
    name = f"events.out.tfevents.{int(events[0][1])}.{process}.0.v2"
    with tf.io.TFRecordWriter(os.path.join(path, name)) as writer:
        writer.write(event_pb2.Event(wall_time=events[0][1]).SerializeToString())
        for step, wall_time, loss in events:
            event = event_pb2.Event(wall_time=wall_time, step=step)
            event.summary.value.add(tag="loss", simple_value=loss)
            writer.write(event.SerializeToString())


def _record(step, update, loss, accuracy, **extra):
    return {
        "global_step": step,
        "update_step": update,
        "loss": loss,
        "accuracy": accuracy,
        "sequence_accuracy": accuracy / 2,
        "eval_tokens": 100,
        **extra,
    }


def _png_size(path):
    """(width, height) of a PNG, checking its signature."""
    with open(path, "rb") as f:
        data = f.read(24)
    assert data[:8] == PNG_SIGNATURE, data[:8]
    return struct.unpack(">II", data[16:24])


def test_curves_hold_the_runs_points(tmp_path):
    run = _write_run(
        tmp_path / "fake8",
        n=4,
        records=[
            _record(40, 10, 2.5, 0.25, wall_time=1000.0, elapsed_seconds=12.0),
            _record(80, 20, 1.5, 0.5, wall_time=1010.0, elapsed_seconds=22.0),
        ],
        train=[(10, 3.0), (20, 2.75), (30, 2.5), (40, 2.25)],
    )
    result = curves.read_run(run)
    assert result.accumulate_steps == 4
    loss = result.train["loss"]
    assert loss.steps == [10, 20, 30, 40]
    assert loss.updates == [2, 5, 7, 10]  # global_step // n
    assert loss.values == pytest.approx([3.0, 2.75, 2.5, 2.25])
    assert loss.seconds[0] == 0.0 and loss.seconds == sorted(loss.seconds)
    assert list(result.dev) == ["loss", "accuracy", "sequence_accuracy"]
    dev = result.dev["loss"]
    assert (dev.steps, dev.updates, dev.values) == ([40, 80], [10, 20], [2.5, 1.5])
    assert dev.seconds == [12.0, 22.0]  # elapsed_seconds, when present
    assert result.dev["accuracy"].values == [0.25, 0.5]
    assert result.dev["sequence_accuracy"].values == [0.125, 0.25]


def test_old_metrics_get_their_times_from_eval_events(tmp_path):
    """metrics.jsonl from before wall_time/elapsed_seconds: eval/ event wall times."""
    run = _write_run(
        tmp_path / "old",
        records=[_record(4, 4, 2.0, 0.1), _record(8, 8, 1.0, 0.2)],
        train=[(2, 3.0), (4, 2.0), (6, 1.5), (8, 1.2)],
        evals=[(4, 2.0), (8, 1.0)],
    )
    result = curves.read_run(run)
    assert result.accumulate_steps == 1  # no run.json: update_step / global_step
    seconds = result.dev["loss"].seconds
    assert None not in seconds and 0.0 <= seconds[0] <= seconds[1] < 60
    assert result.dev["loss"].updates == [4, 8]


def test_time_while_a_run_was_stopped_is_not_counted(tmp_path):
    """A run resumed an hour later: its clock continues where it stopped."""
    run = tmp_path / "resumed"
    _write_events(run / "train", "vm.100", [(10, 1000.0, 3.0), (20, 1010.0, 2.0)])
    _write_events(run / "train", "vm.200", [(30, 4600.0, 1.5), (40, 4604.0, 1.0)])
    _write_events(run / "eval", "vm.100", [(20, 1012.0, 2.2)])
    _write_events(run / "eval", "vm.200", [(40, 4606.0, 1.1)])
    (run / "metrics.jsonl").write_text(
        json.dumps(_record(20, 20, 2.2, 0.3))
        + "\n"
        + json.dumps(_record(40, 40, 1.1, 0.6))
        + "\n"
    )
    result = curves.read_run(str(run))
    assert result.train["loss"].values == [3.0, 2.0, 1.5, 1.0]
    assert result.train["loss"].seconds == pytest.approx([0.0, 10.0, 12.0, 16.0])
    assert result.dev["loss"].seconds == pytest.approx([12.0, 18.0])


def test_elapsed_seconds_set_the_clock_of_training_points(tmp_path):
    """With elapsed_seconds in metrics.jsonl, train points use the same clock."""
    run = tmp_path / "timed"
    _write_events(run / "train", "vm.7", [(10, 500.0, 3.0), (20, 510.0, 2.0)])
    (run / "metrics.jsonl").write_text(
        json.dumps(_record(20, 20, 2.2, 0.3, wall_time=511.0, elapsed_seconds=41.0))
        + "\n"
        + '{"global_step": 30, "upd'  # a line torn by a crash: ignored
    )
    result = curves.read_run(str(run))
    assert result.train["loss"].seconds == pytest.approx([30.0, 40.0])
    assert result.dev["loss"].seconds == [41.0]


def test_plot_several_runs_with_labels(tmp_path):
    runs = [
        _write_run(
            tmp_path / name,
            n=n,
            records=[
                _record(8 * n, 8, 2.0 / n, 0.2),
                _record(16 * n, 16, 1.0 / n, 0.4),
            ],
            train=[(4 * n, 3.0), (8 * n, 2.0), (12 * n, 1.5), (16 * n, 1.2)],
        )
        for name, n in (("fake8", 8), ("big", 1), ("small", 1))
    ]
    plot_file = tmp_path / "figures" / "curves.png"  # the directory is created
    result = run_cli(
        "plot",
        f"--output_dir={','.join(runs)}",
        f"--plot_file={plot_file}",
        "--labels=fake GPU,big batch,small batch",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    width, height = _png_size(plot_file)
    assert (width, height) == (
        1200,
        2 * 340 + 80,
    )  # 12 in × (2 rows × 3.4 + 0.8) in, dpi 100
    assert "loss, accuracy of 3 run(s)" in result.stdout  # no run has BLEU
    assert (
        "fake GPU: 2 evaluations, final dev loss 0.1250 at update 16" in result.stdout
    )


def test_bleu_gets_a_row_and_old_runs_plot_without_times(tmp_path):
    with_bleu = _write_run(
        tmp_path / "text", records=[_record(5, 5, 2.0, 0.2, bleu=12.5)]
    )
    no_times = _write_run(tmp_path / "old", records=[_record(5, 5, 2.5, 0.1)])
    result = curves.read_run(no_times)
    assert result.dev["loss"].seconds == [None] and result.train == {}
    plot_file = tmp_path / "bleu.png"
    cli = run_cli(
        "plot", f"--output_dir={with_bleu},{no_times}", f"--plot_file={plot_file}"
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "loss, accuracy, bleu of 2 run(s)" in cli.stdout
    assert _png_size(plot_file)[1] == 3 * 340 + 80
    assert "  old: 1 evaluations" in cli.stdout  # label: the directory's base name


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("empty_dir", ("holds no run", "metrics.jsonl")),
        ("missing_dir", ("is not a directory",)),
        ("labels", ("--labels has 1 label(s) but --output_dir has 2 run(s)",)),
        ("unwritable", ("--plot_file", "cannot be written")),
        ("format", ("--plot_file", "unknown image format 'txt'")),
        ("metric", ("--metrics: unknown metric 'perplexity'",)),
        ("no_output_dir", ("--output_dir is required",)),
        ("no_plot_file", ("--plot_file is required",)),
    ],
)
def test_user_errors_are_one_line(tmp_path, case, fragments):
    run = _write_run(tmp_path / "run", records=[_record(5, 5, 2.0, 0.2)])
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file").write_text("not a directory")
    args = {
        "empty_dir": [f"--output_dir={tmp_path / 'empty'}"],
        "missing_dir": [f"--output_dir={tmp_path / 'nowhere'}"],
        "labels": [f"--output_dir={run},{run}", "--labels=one"],
        "unwritable": [f"--output_dir={run}", f"--plot_file={tmp_path}/a_file/x.png"],
        "format": [f"--output_dir={run}", f"--plot_file={tmp_path}/x.txt"],
        "metric": [f"--output_dir={run}", "--metrics=loss,perplexity"],
        "no_output_dir": [],
        "no_plot_file": [f"--output_dir={run}", "--plot_file="],
    }[case]
    if not any(a.startswith("--plot_file") for a in args):
        args.append(f"--plot_file={tmp_path / 'out.png'}")
    result = run_cli("plot", *args)
    assert_user_error(result, "t2t-plot", *fragments)
    assert not (tmp_path / "out.png").exists()


@pytest.mark.slow
def test_plot_of_a_real_tiny_run(tmp_path):
    output_dir = str(tmp_path / "run")
    trained = run_cli(
        "trainer",
        *tiny_trainer_flags("algorithmic_reverse"),
        "--hparams=optimizer_multistep_accumulate_steps=2",
        f"--output_dir={output_dir}",
        "--train_steps=16",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    result = curves.read_run(output_dir)
    assert result.accumulate_steps == 2
    assert result.dev["loss"].steps == [4, 8, 12, 16]
    assert result.dev["loss"].updates == [2, 4, 6, 8]
    assert None not in result.dev["loss"].seconds
    assert result.train["loss"].steps == [2, 4, 6, 8, 10, 12, 14, 16]
    assert result.train["loss"].updates == [1, 2, 3, 4, 5, 6, 7, 8]
    plot_file = tmp_path / "real.png"
    plotted = run_cli("plot", f"--output_dir={output_dir}", f"--plot_file={plot_file}")
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    # Columns updates, tokens trained on (the run records them) and time:
    assert _png_size(plot_file)[0] == 1800
    tokens = result.dev["loss"].tokens
    assert None not in tokens and tokens == sorted(tokens) and tokens[0] > 0


def test_a_ramped_run_plots_against_tokens_with_its_noise_scale(tmp_path):
    """Windows that vary: a training point's update comes from its update_step
    event, not global_step // n; tokens_seen gives the middle column; the noise
    scale gets a row."""
    path = tmp_path / "ramp"
    records = [
        _record(6, 4, 2.0, 0.2, tokens_seen=900, noise_scale=300.0),
        _record(14, 6, 1.5, 0.3, tokens_seen=2100, noise_scale=450.0),
    ]
    _write_run(path, records=records)
    with open(path / "run.json", "w") as f:
        json.dump({"accumulate_steps": "batch_size_schedule"}, f)
    writer = tf.summary.create_file_writer(str(path / "train"))
    with writer.as_default():
        for step, update, tokens, noise in ((2, 2, 300, 250.0), (6, 4, 900, 300.0)):
            tf.summary.scalar("loss", 3.0 - update / 4, step=step)
            tf.summary.scalar("update_step", update, step=step)
            tf.summary.scalar("tokens_seen", tokens, step=step)
            tf.summary.scalar("noise_scale", noise, step=step)
    writer.close()
    result = curves.read_run(str(path))
    loss = result.train["loss"]
    assert loss.updates == [2, 4] and loss.tokens == [300, 900]
    assert result.train["noise_scale"].values == [250.0, 300.0]
    assert result.dev["noise_scale"].values == [300.0, 450.0]
    assert result.dev["loss"].tokens == [900, 2100]
    assert result.accumulate_steps == 2  # 14 micro-steps / 6 updates, rounded
    plot_file = tmp_path / "ramp.png"
    cli = run_cli("plot", f"--output_dir={path}", f"--plot_file={plot_file}")
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "loss, accuracy, noise_scale of 1 run(s)" in cli.stdout
    # three columns (updates, tokens, time) of 6 in; three rows of 3.4 in:
    assert _png_size(plot_file) == (1800, 3 * 340 + 80)
