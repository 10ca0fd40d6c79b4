"""A run's learning curves as plain lists, for t2t-plot (no plotting here).

Two sources, both written by the trainer (see outputs/run_files.py for the layout):

  OUTPUT_DIR/metrics.jsonl   dev metrics, one record per evaluation: global_step,
                             update_step, loss, accuracy, sequence_accuracy (, bleu),
                             and in newer runs wall_time, elapsed_seconds,
                             tokens_seen, tokens_per_update (, noise_scale)
  OUTPUT_DIR/train/          TensorBoard events: the training loss (tag "loss"),
                             stepped in micro-steps (global_step), and in newer runs
                             update_step, tokens_seen, tokens_per_update, noise_scale

Every point has four x coordinates: micro-steps (global_step), updates (update_step),
target tokens trained on (tokens_seen, None where a run did not record it) and
seconds of training since the run began. A training point's update is its step's
update_step event, else global_step // n (n = run.json's accumulate_steps; runs
older than varying windows). Seconds come from a record's
elapsed_seconds when it has one; otherwise from TensorBoard's event wall times, on a
clock that skips the time between a run's segments (a resume) so that a resumed run
is not charged for the hours it was stopped. Runs written before metrics.jsonl held
times still plot against time that way.
"""

import dataclasses
import json
import os
import re

import tensorflow as tf
from tensorflow.core.util import event_pb2

from t2t_lite.constants import BATCH_CURVES, EVAL_METRICS
from t2t_lite.errors import UserError, first_line
from t2t_lite.outputs.run_files import METRICS_FILE, RUN_FILE
from t2t_lite.tf_data import without_autotuning

TRAIN_DIR, EVAL_DIR = "train", "eval"
CURVES = EVAL_METRICS + BATCH_CURVES  # what a run's curves can hold
_TRAIN_TAGS = ("loss",) + BATCH_CURVES
# events.out.tfevents.<time>.<host>.<pid>.<counter>.v2: <host>.<pid> names the process.
_WRITER = re.compile(r"events\.out\.tfevents\.\d+\.(.+)\.\d+\.v2$")


@dataclasses.dataclass
class Curve:
    """One metric of one run: parallel lists, one entry per point.

    seconds[i] is None when no time is known for point i (it is then left out of
    plots against time).
    """

    steps: list  # global_step: micro-batches consumed
    updates: list  # update_step: optimizer updates applied
    seconds: list  # training seconds since the run began (or None)
    values: list
    tokens: list = dataclasses.field(default_factory=list)  # tokens_seen (or None)

    def __len__(self):
        return len(self.values)


@dataclasses.dataclass
class RunCurves:
    """The curves of one run directory."""

    path: str
    accumulate_steps: int  # n: micro-steps per update (its mean when windows vary)
    train: dict  # {"loss": Curve} from train/ events
    dev: dict  # {metric: Curve} from metrics.jsonl, for metrics it holds


@dataclasses.dataclass
class _Segment:
    """The [start, end] wall-time span of one process's events, and the run's
    elapsed seconds at its start."""

    start: float
    end: float
    elapsed_at_start: float = 0.0


def _event_files(directory):
    if not tf.io.gfile.isdir(directory):
        return []
    return sorted(
        os.path.join(directory, name)
        for name in tf.io.gfile.listdir(directory)
        if name.startswith("events.out.tfevents.")
    )


def _scalar(value):
    if value.HasField("simple_value"):  # TF1-style summary
        return float(value.simple_value)
    return float(tf.make_ndarray(value.tensor))


def read_events(path):
    """[(tag, step, wall_time, value)] of the summaries in one event file; value is
    None for a non-scalar one (text, histogram, hparams: not a curve, but its time
    tells when the run was alive). A file cut short by a crash yields the events
    before the cut.
    """
    events = []
    try:
        for record in without_autotuning(tf.data.TFRecordDataset(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                try:
                    scalar = _scalar(value)
                except (ValueError, TypeError):
                    scalar = None
                events.append((value.tag, event.step, event.wall_time, scalar))
    except tf.errors.DataLossError:
        pass  # a truncated last record: keep what came before it
    except (OSError, tf.errors.OpError) as e:
        raise UserError(f"{path} is unreadable: {first_line(e)}") from None
    return events


def _read_metrics(path):
    records = []
    try:
        with tf.io.gfile.GFile(path) as f:
            lines = f.read().splitlines()
    except (OSError, tf.errors.OpError) as e:
        raise UserError(f"{path} is unreadable: {first_line(e)}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # a line torn by a crash mid-append: the file ends there
            raise UserError(f"{path}:{number} is not a JSON line.") from None
        if isinstance(record, dict) and "global_step" in record:
            records.append(record)
    return records


def _accumulate_steps(run_dir, records):
    """n from run.json; else (windows that vary, or no run.json) the step/update
    ratio of the metrics; else 1."""
    path = os.path.join(run_dir, RUN_FILE)
    if tf.io.gfile.exists(path):
        try:
            with tf.io.gfile.GFile(path) as f:
                n = json.loads(f.read()).get("accumulate_steps")
            if isinstance(n, int) and n >= 1:
                return n
        except (OSError, tf.errors.OpError, json.JSONDecodeError, AttributeError):
            pass
    for record in reversed(records):
        if record.get("update_step"):
            return max(1, round(record["global_step"] / record["update_step"]))
    return 1


def _process(path):
    """The process that wrote an event file (its host and pid), or the file name."""
    name = os.path.basename(path)
    match = _WRITER.match(name)
    return match.group(1) if match else name


def _segments(events_by_file, records):
    """The run's segments (one per process that wrote events) on one clock.

    events_by_file: {path: events}. A process's train/ and eval/ files form one
    segment, spanning its first to its last event; overlapping spans merge. A
    segment's elapsed seconds at its start are taken from a metrics record written
    during it (wall_time and elapsed_seconds), else they continue from the end of
    the previous segment: the time between segments (a stopped run) is not counted.
    """
    by_process = {}
    for path, events in events_by_file.items():
        times = [e[2] for e in events]
        if times:
            low, high = by_process.get(_process(path), (min(times), max(times)))
            by_process[_process(path)] = (min(low, *times), max(high, *times))
    segments = []
    for start, end in sorted(by_process.values()):
        if segments and start <= segments[-1].end:
            segments[-1].end = max(segments[-1].end, end)
        else:
            segments.append(_Segment(start, end))
    timed = [
        r
        for r in records
        if isinstance(r.get("wall_time"), (int, float))
        and isinstance(r.get("elapsed_seconds"), (int, float))
    ]
    elapsed = 0.0
    for segment in segments:
        inside = [
            r
            for r in timed
            if segment.start - 1.0 <= r["wall_time"] <= segment.end + 1.0
        ]
        if inside:
            r = inside[0]
            elapsed = r["elapsed_seconds"] - (r["wall_time"] - segment.start)
        segment.elapsed_at_start = max(0.0, elapsed)
        elapsed = segment.elapsed_at_start + (segment.end - segment.start)
    return segments


def _clock(segments):
    """wall_time -> elapsed seconds of training (None if the run has no events).
    A time between two segments counts as the end of the earlier one; a time before
    the first segment as its start."""

    def elapsed(wall_time):
        if not segments:
            return None
        current = segments[0]
        for segment in segments:
            if wall_time < segment.start:
                break
            current = segment
        wall_time = min(max(wall_time, current.start), current.end)
        return current.elapsed_at_start + wall_time - current.start

    return elapsed


def _train_curves(train_events, n, clock):
    at_step = {"update_step": {}, "tokens_seen": {}}
    for tag, step, _, value in train_events:
        if tag in at_step and value is not None:
            at_step[tag][step] = value
    curves = {}
    for tag, step, wall_time, value in sorted(train_events, key=lambda e: e[2]):
        if tag not in _TRAIN_TAGS or value is None:
            continue
        curve = curves.setdefault(tag, Curve([], [], [], []))
        curve.steps.append(step)
        curve.updates.append(int(at_step["update_step"].get(step, step // n)))
        curve.seconds.append(clock(wall_time))
        curve.values.append(value)
        curve.tokens.append(at_step["tokens_seen"].get(step))
    return curves


def _record_seconds(records, eval_events, clock):
    """Seconds of each record: elapsed_seconds; else the clock at its wall_time;
    else at the wall time of its eval/ "loss" event (the k-th record at a step
    matches the k-th event at that step)."""
    event_times = {}
    for tag, step, wall_time, _ in sorted(eval_events, key=lambda e: e[2]):
        if tag == "loss":
            event_times.setdefault(step, []).append(wall_time)
    seen = {}
    seconds = []
    for record in records:
        step = record["global_step"]
        k = seen[step] = seen.get(step, -1) + 1
        if isinstance(record.get("elapsed_seconds"), (int, float)):
            seconds.append(float(record["elapsed_seconds"]))
        elif isinstance(record.get("wall_time"), (int, float)):
            seconds.append(clock(record["wall_time"]))
        elif event_times.get(step):
            times = event_times[step]
            seconds.append(clock(times[min(k, len(times) - 1)]))
        else:
            seconds.append(None)
    return seconds


def _dev_curves(records, seconds, n):
    curves = {}
    for record, second in zip(records, seconds):
        for metric in CURVES:
            value = record.get(metric)
            if not isinstance(value, (int, float)):
                continue
            curve = curves.setdefault(metric, Curve([], [], [], []))
            step = record["global_step"]
            curve.steps.append(step)
            curve.updates.append(record.get("update_step", step // n))
            curve.seconds.append(second)
            curve.values.append(float(value))
            curve.tokens.append(record.get("tokens_seen"))
    return curves


def read_run(run_dir):
    """The RunCurves of `run_dir`; a UserError if it holds no run (neither
    metrics.jsonl nor TensorBoard events in train/)."""
    if not tf.io.gfile.isdir(run_dir):
        raise UserError(f"--output_dir '{run_dir}' is not a directory.")
    metrics_path = os.path.join(run_dir, METRICS_FILE)
    train_files = _event_files(os.path.join(run_dir, TRAIN_DIR))
    has_metrics = tf.io.gfile.exists(metrics_path)
    if not has_metrics and not train_files:
        raise UserError(
            f"--output_dir '{run_dir}' holds no run: neither {METRICS_FILE} nor "
            f"TensorBoard events in {TRAIN_DIR}/ (is it a t2t-trainer output_dir?)."
        )
    records = _read_metrics(metrics_path) if has_metrics else []
    train = {path: read_events(path) for path in train_files}
    evals = {
        path: read_events(path)
        for path in _event_files(os.path.join(run_dir, EVAL_DIR))
    }
    clock = _clock(_segments({**train, **evals}, records))
    n = _accumulate_steps(run_dir, records)
    train_events = [e for events in train.values() for e in events]
    eval_events = [e for events in evals.values() for e in events]
    seconds = _record_seconds(records, eval_events, clock)
    return RunCurves(
        path=run_dir,
        accumulate_steps=n,
        train=_train_curves(train_events, n, clock),
        dev=_dev_curves(records, seconds, n),
    )
