"""Training: a run set up (training/opening/trainer_setup.py) and a short loop whose
side work is done by hooks (training/loop/hooks.py).

Library code: it takes `TrainerOptions` (training/opening/trainer_options.py) and an
HParams, never flags (bin/trainer.py generates the flags from TrainerOptions).
"""

import time

import tensorflow as tf
from absl import logging

from t2t_lite.errors import is_peer_failure
from t2t_lite.optim.schedule import RATE_RULES, reference_tokens
from t2t_lite.training.cluster.lost_worker import worker_lost
from t2t_lite.training.loop.hooks import Loop, default_hooks
from t2t_lite.training.loop.preemption import StopRequest
from t2t_lite.training.opening.trainer_options import (
    TrainerOptions,
    TrainerOptionsError,
)
from t2t_lite.training.opening.trainer_setup import TrainerSetup
from t2t_lite.training.reporting.reporter import DivergenceError, write_hparams_summary
from t2t_lite.training.step import out_of_memory

# Callers import these from here, the module that runs training:
__all__ = [
    "DivergenceError",
    "Trainer",
    "TrainerOptions",
    "TrainerOptionsError",
    "simulation_line",
]


def simulation_line(hp, replicas, plan):
    """The start-up line stating what a micro-step and an update stand for under
    the run's batch plan, and how the learning rate follows the batch."""
    return _batch_text(hp, replicas, plan) + _rate_text(hp, plan)


def _batch_text(hp, replicas, plan):
    if not plan.constant:
        first = plan.tokens(0)
        return (
            f"micro-batch {hp.batch_size} tokens × {replicas} replica"
            f"{'s' if replicas != 1 else ''}, {plan.describe()}: the first update "
            f"{plan.size(0)} accumulation step(s) = {first} tokens/update"
        )
    n = plan.n
    per_update = hp.batch_size * n * replicas
    line = (
        f"micro-batch {hp.batch_size} tokens × {n} accumulation steps × "
        f"{replicas} replica{'s' if replicas != 1 else ''} = {per_update} "
        f"tokens/update (simulating {n * replicas} GPU{'s' if n * replicas != 1 else ''})"
    )
    if hp.effective_batch_size > 0:
        line += (
            f"; accumulation steps = ceil(effective_batch_size {hp.effective_batch_size}"
            f" / ({hp.batch_size} × {replicas})) = {n}, rounded up by "
            f"{per_update - hp.effective_batch_size} tokens"
        )
    return line


def _rate_text(hp, plan):
    """The start-up line's part on what follows the batch: the rate, the
    schedule's unit, Adam's betas ("" when nothing does)."""
    rule, unit = hp.learning_rate_batch_scaling, hp.learning_rate_schedule_unit
    reference, parts = reference_tokens(hp, plan), []
    if rule != "none":
        parts.append(
            f"learning rate × (tokens/update ÷ {reference})^{RATE_RULES[rule]:g}"
        )
    if unit == "tokens":
        parts.append(f"schedule step = tokens trained on ÷ {reference}")
    if hp.adam_beta_tokens_reference:
        betas = "beta1, beta2" if hp.adam_beta1_follows_tokens else "beta2"
        parts.append(
            f"Adam {betas} ** (tokens/update ÷ {hp.adam_beta_tokens_reference})"
        )
    return "; " + ", ".join(parts) if parts else ""


class Trainer(TrainerSetup):
    """A TrainerSetup that trains: `train()` resumes, loops over micro-steps and
    returns the final evaluation.

    callbacks: extra hooks after the default ones (training/loop/hooks.py), e.g. the
    profilers' timers in scripts/. simulated_memory: see TrainerSetup.
    """

    def __init__(self, options, hp, strategy=None, callbacks=(), simulated_memory=None):
        super().__init__(options, hp, strategy, simulated_memory=simulated_memory)
        self.hooks = default_hooks(self) + list(callbacks)

    def train(self):
        """Trains up to train_steps micro-steps; returns the final evaluation record.

        Returns None when a SIGTERM/SIGINT stopped the run early (after saving a
        checkpoint; `stopped_by` names the signal). Raises DivergenceError after
        max_consecutive_bad_updates NaN/Inf updates in a row; WorkerLost (one line)
        when another worker of a multi-host run is gone.
        """
        try:
            return self._train()
        except tf.errors.OpError as e:
            if self.workers > 1 and is_peer_failure(e):
                raise worker_lost(
                    e,
                    self.task,
                    self.options.output_dir,
                    self.workers,
                    int(self.step.micro_step),
                ) from None
            raise

    def _train(self):
        inputs, start = self.resume()
        if start >= self.options.train_steps:
            logging.info("Already trained to step %d; evaluating only.", start)
            return self.evaluate(write=False)
        if self.eval_tracker.had_stopped_early():
            logging.info(
                "The run had stopped early; evaluating only (raise "
                "eval_early_stopping_steps, or set it to 0, to train on)."
            )
            return self.evaluate(write=False)
        write_hparams_summary(
            self.reporter.writer("train"), self.hp, self.options, start
        )
        logging.info(simulation_line(self.hp, self.replicas, self.plan))
        self._warn_about_an_incomplete_window()
        try:
            with StopRequest() as stop:
                return self._loop(inputs, Loop(stop, start, self.workers > 1))
        finally:
            self.reporter.close()

    def _warn_about_an_incomplete_window(self):
        train_steps = self.options.train_steps
        updates = self.plan.train_updates(train_steps)
        # A plan with state (an adaptive batch) cannot count its updates ahead.
        if updates != int(updates) and self.plan.state is None:
            logging.warning(
                "train_steps=%d does not end an accumulation window (%s): the last "
                "%d micro-batches will not reach the weights.",
                train_steps,
                self.plan.describe(),
                round((updates - int(updates)) * self.plan.size(int(updates))),
            )

    def _loop(self, inputs, loop):
        """Micro-steps from loop.start to train_steps, window by window (each
        window's size is decided when it starts, training/step/train_step.py); the
        hooks do everything else."""
        self.notify("begin", loop)
        step, train_steps, last_size = loop.start, self.options.train_steps, None
        for size, first in self.step.windows(self._decided):
            if size != last_size and not self.plan.constant:
                self.reporter.window_size(step, size, last_size)
                last_size = size
            for position in range(first, size):
                if self._micro_step(inputs, loop, step, position + 1 == size):
                    return loop.result
                step += 1
                if step == train_steps:  # not a step more, nor a window more
                    self.notify("at_end", loop)
                    return loop.result

    def _micro_step(self, inputs, loop, step, closes_window):
        """One micro-step, then the hooks; True when one of them ended the loop."""
        began = time.perf_counter()
        batch = inputs.next()
        self.notify("on_input", time.perf_counter() - began)
        if loop.many_workers and loop.stop.requested:
            self.step.request_stop()  # the vote travels with the next all-reduce
        began = time.perf_counter()
        loop.out = self.step.train_on(batch, closes_window)
        seconds = time.perf_counter() - began
        self.notify("on_step", step, seconds)
        self.step.plan.observe(seconds, self._padded_tokens(batch), closes_window)
        loop.done, loop.record = step + 1, None
        for hook in self.hooks:
            if hasattr(hook, "after_step"):
                hook.after_step(loop)
            if loop.finished:
                return True
        return False

    def _padded_tokens(self, batch):
        """Padded tokens of `batch` over all replicas (the busiest replica's
        share times the replicas: what the step's time follows)."""
        return self.replicas * out_of_memory.padded_tokens(batch, self.strategy)

    def _decided(self, update, old, new):
        """An adaptive batch's decision: logged, and in metrics.jsonl."""
        self.reporter.batch_decision(
            update,
            old,
            new,
            self.step.noise_scale_value(),
            self.step.plan.decision_facts(),
            self.step.plan.size(update),
        )
