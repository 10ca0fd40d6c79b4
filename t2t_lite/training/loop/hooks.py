"""The training loop's hooks: what happens between steps, one concern per hook.

training/loop/trainer.py's loop only steps; after every micro-step it hands a `Loop` (the
loop's state) to each hook's `after_step`, in order, until one ends the loop, and to
`at_end` once the last step is done. The order is the contract:

1. ProgressHook — throughput meter, the divergence watch, the periodic log line;
2. StopRequestHook — whether this step stops the run (a signal, or on many workers
   any worker's vote, read from this update's all-reduce);
3. SaveHook — a checkpoint every save_checkpoints_steps and at every stop, so a stop
   always comes with a checkpoint of that very step;
4. EvaluationHook — evaluation every local_eval_frequency steps, the best checkpoint
   and early stopping.

Profiling objects (scripts/) are hooks too: any object with on_input(seconds),
on_step(step, seconds), on_save(seconds) or on_evaluate(seconds) is told how long
each took (the same `notify` calls these events).
"""

import dataclasses

from t2t_lite.training.reporting.progress import ThroughputMeter


@dataclasses.dataclass
class Loop:
    """What the hooks share while a run trains."""

    stop: object  # training/loop/preemption.py's StopRequest
    start: int  # the global step the loop started from
    many_workers: bool
    done: int = 0  # global steps done, this step included
    out: dict = None  # the train step's outputs of this step
    stopping: object = None  # None/False, a signal's name, or "peer"
    saved_at: int = 0  # the global step of the newest checkpoint
    record: dict = None  # this step's evaluation record, if it evaluated
    finished: bool = False  # set by finish(): the loop returns `result`
    result: dict = None

    def finish(self, result):
        self.finished, self.result = True, result


class ProgressHook:
    """Averages loss and tokens/s between log lines; at log, checkpoint and stop
    steps checks for too many skipped updates (raises DivergenceError)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.meter = None

    def begin(self, loop):
        self.meter = ThroughputMeter(loop.start, self.trainer.options.train_steps)

    def after_step(self, loop):
        options, reporter = self.trainer.options, self.trainer.reporter
        self.meter.add(loop.out)
        done = loop.done
        logging_now = done % options.log_steps == 0 or done == options.train_steps
        saving = done % options.save_checkpoints_steps == 0
        if logging_now or saving or loop.stop.requested:
            reporter.check_divergence(done)
        if logging_now:
            reporter.training(self.meter, done)


class StopRequestHook:
    """A signal may arrive at any point of a step: the request is read here, once
    per step, so that the save that follows is of this very step. On many workers,
    all stop at the update where any of them asked to (their votes travel with the
    update's all-reduce)."""

    def after_step(self, loop):
        stopping = loop.stop.requested
        if loop.many_workers:
            votes = loop.out.get("stop_votes")
            stopping = bool(votes and float(votes[0]) > 0) and (stopping or "peer")
        loop.stopping = stopping


class SaveHook:
    """Checkpoints every save_checkpoints_steps, at a stop (then ends the loop) and
    after the last step."""

    def __init__(self, trainer):
        self.trainer = trainer

    def begin(self, loop):
        loop.saved_at = loop.start

    def after_step(self, loop):
        trainer = self.trainer
        if loop.done % trainer.options.save_checkpoints_steps == 0 or loop.stopping:
            trainer.save()
            loop.saved_at = loop.done
        if loop.stopping:
            if loop.stopping == "peer":
                peer = "early stopping" if trainer.early_stopped else "another worker"
                trainer.stopped_by = peer
            else:
                trainer.stopped_by = loop.stopping
            loop.finish(None)

    def at_end(self, loop):
        if loop.saved_at != self.trainer.options.train_steps:
            self.trainer.save()


class EvaluationHook:
    """Evaluates every local_eval_frequency steps (recording the best checkpoint)
    and stops early when the metric has not improved for long enough; after the last
    step, evaluates unless that step just did."""

    def __init__(self, trainer):
        self.trainer = trainer

    def after_step(self, loop):
        trainer, frequency = self.trainer, self.trainer.options.local_eval_frequency
        if not frequency or loop.done % frequency:
            return
        loop.record = trainer.evaluate(stop=loop.stop)
        evaluated = bool(loop.record and "loss" in loop.record)  # the chief's, in full
        if evaluated and trainer.eval_tracker.should_stop_early(loop.done):
            if not loop.many_workers:
                trainer.eval_tracker.checkpoint_of(loop.done)  # saved unless it was
                loop.finish(loop.record)
            else:
                trainer.step.request_stop()  # every worker stops at the next update

    def at_end(self, loop):
        loop.result = loop.record or self.trainer.evaluate(stop=loop.stop)
        if loop.result is None:  # stopped during the final evaluation; already saved
            self.trainer.stopped_by = loop.stop.requested


def default_hooks(trainer):
    """The loop's hooks in their contract order (see the module docstring)."""
    return [
        ProgressHook(trainer),
        StopRequestHook(),
        SaveHook(trainer),
        EvaluationHook(trainer),
    ]
