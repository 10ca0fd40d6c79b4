"""The training loop: build everything from names + hparams, train, evaluate, save.

Library code: it takes a `RunConfig` and an HParams, never flags (bin/trainer.py owns
the flags).
"""

import dataclasses
import os
import time

import keras
import tensorflow as tf
from absl import logging

from t2t_lite.data.pipeline import batches_from_hparams
from t2t_lite.decoding.decoder import decode_hparams
from t2t_lite.optim.schedule import accumulate_steps
from t2t_lite.registry import MODELS, PROBLEMS
from t2t_lite.runs import run_dir
from t2t_lite.runs.best import check_metric
from t2t_lite.runs.checkpoints import CheckpointKeeper, InputPipelineChanged
from t2t_lite.runs.warm_start import warm_start
from t2t_lite.training.build import build_run
from t2t_lite.training.distribution import is_chief, num_workers, worker_index
from t2t_lite.training.evaluation import BleuEvaluator, Evaluator
from t2t_lite.training.inputs import ReplicaInputs
from t2t_lite.training.preemption import StopRequest
from t2t_lite.training.progress import ThroughputMeter
from t2t_lite.training.run_info import check_train_steps_change, write_hparams_summary
from t2t_lite.training.run_state import DivergenceError, RunLog, RunState
from t2t_lite.training.train_step import OPTIONAL_CHECKPOINT_ITEMS

# DivergenceError is raised by run_state.py's RunLog; callers catch it from here.
__all__ = ["DivergenceError", "RunConfig", "Trainer", "simulation_line"]


@dataclasses.dataclass
class RunConfig:
    """What a run needs besides hparams (T2T's flag names)."""

    problem: str
    model: str
    output_dir: str
    train_steps: int  # micro-steps (batches consumed), as in T2T
    data_dir: str = ""
    eval_steps: int = 100  # dev batches per evaluation; <= 0: the whole dev set
    local_eval_frequency: int = 1000
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 20
    log_steps: int = 100
    random_seed: int = 1
    deterministic: bool = False  # TF op determinism: bitwise-repeatable runs, slower
    # XLA-compile the forward+backward; training batches are padded to their bucket's
    # length so that XLA compiles once per bucket:
    xla: bool = False
    # BLEU at every evaluation, for problems with dev text (translation problems):
    eval_bleu_sentences: int = 0  # dev sentences decoded; 0: no BLEU; < 0: all
    eval_decode_hparams: object = None  # decode_hparams(); None: greedy, a cheap trend
    # A run dir or checkpoint whose model weights start a NEW run (fine-tuning); a
    # run that already has checkpoints resumes from its own and ignores it:
    warm_start_from: str = ""
    # Evaluate (loss, accuracy, BLEU) on the test split instead of dev (T2T's flag):
    eval_use_test_set: bool = False
    # The best checkpoint (runs/best.py) is chosen by this metric, minimized or
    # maximized (None: loss minimized, the others maximized); early stopping after
    # this many global steps without improvement (0: off), as T2T's flags:
    eval_early_stopping_metric: str = "loss"
    eval_early_stopping_metric_minimize: object = None
    eval_early_stopping_steps: int = 0
    # One checkpoint per this many hours is never deleted (0: off):
    keep_checkpoint_every_n_hours: float = 0.0


def simulation_line(hp, replicas):
    """The start-up line stating what a micro-step and an update stand for."""
    n = accumulate_steps(hp, replicas)
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


class Trainer:
    """Owns model, optimizer, train step, evaluator and checkpoint manager of one run.

    Distribution (a MirroredStrategy or MultiWorkerMirroredStrategy passed in, see
    training/distribution.py): every replica reads its own shard of the data through
    a checkpointed iterator (training/inputs.py); every worker takes part in each
    checkpoint save (reading replica-local accumulators is a collective), the chief
    writes the run's files (hparams.json, run.json, metrics.jsonl, TensorBoard,
    checkpoints) and evaluates while the others wait at the next all-reduce. Other
    workers keep their own checkpoints (their input iterators) under
    OUTPUT_DIR/workers/worker-I, so a multi-host run also resumes exactly.
    """

    def __init__(self, config, hp, strategy=None, callbacks=()):
        """hp: validated hparams (bin/trainer.py's build_hparams parses and checks).
        callbacks: objects with any of on_step(step, seconds), on_input(seconds),
        on_save(seconds), on_evaluate(seconds) (profiling, see scripts/)."""
        self.config = config
        self.hp = hp
        self.callbacks = list(callbacks)
        self.stopped_by = None  # the signal's name when a SIGTERM/SIGINT ended train()
        self.input_pipeline_changed = False  # set by restore(): data order restarts
        self.strategy = strategy or tf.distribute.get_strategy()
        self.replicas = self.strategy.num_replicas_in_sync
        self.chief = is_chief(self.strategy)
        self.problem = PROBLEMS.get(config.problem)()
        self.problem.load(config.data_dir or None)
        self.eval_split = "test" if config.eval_use_test_set else "dev"
        if config.eval_use_test_set:
            self.problem.require_split("test")  # one line, before anything is written
        MODELS.get(config.model)  # an unknown name fails before anything is written
        check_metric(
            config.eval_early_stopping_metric,
            bool(config.eval_bleu_sentences and self.problem.reports_bleu),
        )
        # Best checkpoint, early stopping, elapsed time (training/run_state.py):
        self.run_state = RunState(
            config.output_dir,
            config.eval_early_stopping_metric,
            config.eval_early_stopping_metric_minimize,
            config.eval_early_stopping_steps,
            save=self.save,
            workers=num_workers(self.strategy),
        )
        self.n = accumulate_steps(hp, self.replicas)
        if self.chief:
            run_dir.prepare_output_dir(config.output_dir, hp)
            run_dir.check_run_identity(
                config.output_dir,
                {
                    "problem": config.problem,
                    "model": config.model,
                    "vocab_fingerprint": self.problem.vocab_fingerprint(),
                    "accumulate_steps": self.n,
                },
                hints={"accumulate_steps": self._accumulation_hint()},
            )
            check_train_steps_change(
                config.output_dir,
                run_dir.record_train_steps(config.output_dir, config.train_steps),
                config.train_steps,
                hp,
            )
        if config.deterministic:
            tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(config.random_seed)
        self.run = build_run(
            hp,
            vocab_size=self.problem.vocab_size,
            train_steps=config.train_steps,
            model=config.model,
            strategy=self.strategy,
            jit_compile=config.xla,
        )
        self.model, self.optimizer = self.run.model, self.run.optimizer
        self.schedule, self.step = self.run.schedule, self.run.step
        self.evaluator = Evaluator(self.model, hp.label_smoothing)
        self.bleu_evaluator = None
        if config.eval_bleu_sentences and self.problem.reports_bleu and self.chief:
            self.bleu_evaluator = BleuEvaluator(
                self.model,
                self.problem,
                config.eval_decode_hparams or decode_hparams("beam_size=1"),
                config.eval_bleu_sentences,
                max_input_length=hp.max_length or hp.batch_size,
                split=self.eval_split,
            )
        self.checkpoint = self.run.checkpoint()
        self.checkpoints = CheckpointKeeper(
            self.checkpoint,
            self._checkpoint_dir(),
            config.keep_checkpoint_max,
            self.model.trainable_variables,
            keep_every_n_hours=config.keep_checkpoint_every_n_hours,
            optional=OPTIONAL_CHECKPOINT_ITEMS,
        )
        # TensorBoard, log lines, skipped updates (training/run_state.py):
        self.run_log = RunLog(
            config.output_dir, self.chief, self.run, hp, self.checkpoints
        )

    @property
    def best(self):
        """The run's BestCheckpoint (runs/best.py); bin/trainer.py reports it."""
        return self.run_state.best

    @property
    def early_stopped(self):
        """Why early stopping ended train(), or None."""
        return self.run_state.early_stopped

    def _accumulation_hint(self):
        """Why n changed on resume: only effective_batch_size makes it depend on
        the replica count (n itself is an hparam, guarded with the others)."""
        if self.hp.effective_batch_size <= 0:
            return None
        return (
            f" (effective_batch_size {self.hp.effective_batch_size} on "
            f"{self.replicas} replica(s) of batch_size {self.hp.batch_size}); resume "
            "on the replica count it was trained on, or use a new output_dir."
        )

    def _checkpoint_dir(self):
        if self.chief:
            return self.config.output_dir
        path = os.path.join(
            self.config.output_dir, "workers", f"worker-{worker_index(self.strategy)}"
        )
        tf.io.gfile.makedirs(path)
        return path

    # --- checkpoints --------------------------------------------------------------

    def restore(self):
        """Restores the newest readable checkpoint, if any; returns the global step.
        Without one, a warm start (config.warm_start_from) loads model weights."""
        try:
            path = self.checkpoints.restore_newest_readable()
        except InputPipelineChanged as e:
            # The iterators' saved state fits another tf.data graph (t2t_lite's
            # pipeline changed between versions): restore all but them, once.
            logging.warning(
                "The input pipeline differs from the one that wrote %s: resuming "
                "weights, optimizer and counters; the training data order restarts.",
                e.path,
            )
            self.checkpoints.allow_partial()
            path = self.checkpoints.restore_newest_readable(root=self.run.checkpoint())
            self.input_pipeline_changed = True
        if path is None and self.config.warm_start_from:
            warm_start(
                self.model,
                self.config.warm_start_from,
                self.problem.vocab_fingerprint(),
            )
        self.run.replicas_variable.assign(self.replicas)  # this run's, not the old one
        if path:
            logging.info(
                "Resumed from %s (global step %d, update %d).",
                path,
                self.step.micro_step,
                self.step.update_step,
            )
        return self.step.micro_step

    def save(self):
        """Writes a checkpoint at the current step; returns its path (None if the
        weights were not finite and nothing was written). Every worker must call it
        at the same step."""
        started = time.perf_counter()
        path = self.checkpoints.save(self.step.micro_step)
        if path and self.chief:
            logging.info("Saved checkpoint %s.", path)
        self._notify("on_save", time.perf_counter() - started)
        return path

    def _notify(self, event, *args):
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method:
                method(*args)

    # --- data ---------------------------------------------------------------------

    def dataset(self, split, training, seed=None, replica=0, num_replicas=1):
        """Token-batched `split`; for training, shard `replica` of `num_replicas`
        (padded to bucket lengths under XLA: one compiled shape per bucket)."""
        return batches_from_hparams(
            self.problem,
            self.hp,
            split,
            data_dir=self.config.data_dir or None,
            training=training,
            seed=seed,
            replica=replica,
            num_replicas=num_replicas,
            pad_to_bucket=training and self.config.xla,
        )

    def _replica_train_dataset(self, replica, num_replicas):
        """Replica `replica`'s training batches: its own shard, its own shuffle seed
        (replica 0's is the single-device run's, which it then equals)."""
        return self.dataset(
            "train",
            training=True,
            seed=self.config.random_seed + replica,
            replica=replica,
            num_replicas=num_replicas,
        )

    # --- evaluation ---------------------------------------------------------------

    def evaluate(self, write=True, stop=None):
        """Evaluates on the dev split, or on the test split with eval_use_test_set
        (its records say "eval_split": "test") (the chief only; other workers return
        the counters alone); appends to metrics.jsonl and TensorBoard unless
        write=False. Returns None if a stop request interrupted it."""
        record = {
            "global_step": self.step.micro_step,
            "update_step": self.step.update_step,
        }
        if not self.chief:
            return record
        started = time.perf_counter()
        metrics = self.evaluator.evaluate(
            self.dataset(self.eval_split, training=False),
            self.config.eval_steps,
            should_stop=lambda: bool(stop and stop.requested),
            split=self.eval_split,
        )
        if metrics is None:
            return None
        if self.eval_split != "dev":
            metrics["eval_split"] = self.eval_split
        if self.bleu_evaluator:
            bleu = self.bleu_evaluator.evaluate(lambda: bool(stop and stop.requested))
            if bleu is None:
                return None
            metrics.update(bleu)
        record.update(metrics)
        if write:
            record.update(self.run_state.track_best(record))
            run_dir.append_metrics(self.config.output_dir, record)
        self.run_log.evaluation(record, summaries=write)
        self._notify("on_evaluate", time.perf_counter() - started)
        return record

    # --- the loop -------------------------------------------------------------------

    def train(self):
        """Trains up to train_steps micro-steps; returns the final evaluation record.

        Returns None when a SIGTERM/SIGINT stopped the run early (after saving a
        checkpoint; `stopped_by` names the signal). Raises DivergenceError after
        max_consecutive_bad_updates NaN/Inf updates in a row.
        """
        config = self.config
        # The input iterators are checkpointed with the model (shuffle buffer and
        # bucket contents included), so a resumed run sees exactly the batches an
        # uninterrupted run would have seen next.
        inputs = ReplicaInputs(self.strategy, self._replica_train_dataset)
        self._attach_iterators(inputs)
        start = self.restore()
        if self.input_pipeline_changed:  # the failed iterator restore may have left
            inputs = ReplicaInputs(self.strategy, self._replica_train_dataset)
            self._attach_iterators(inputs)  # them half-restored: start them afresh
        self.run_state.recover(start)
        if start >= config.train_steps:
            logging.info("Already trained to step %d; evaluating only.", start)
            return self.evaluate(write=False)
        if self.run_state.had_stopped_early():
            logging.info(
                "The run had stopped early; evaluating only (raise "
                "eval_early_stopping_steps, or set it to 0, to train on)."
            )
            return self.evaluate(write=False)
        write_hparams_summary(self.run_log.writer("train"), self.hp, self.config, start)
        logging.info(simulation_line(self.hp, self.replicas))
        if config.train_steps % self.n:
            logging.warning(
                "train_steps=%d is not a multiple of %d accumulation steps: the last "
                "%d micro-batches will not reach the weights.",
                config.train_steps,
                self.n,
                config.train_steps % self.n,
            )
        try:
            with StopRequest() as stop:
                record = self._loop(inputs, start, stop)
        finally:
            self.run_log.close()
        return record

    def _attach_iterators(self, inputs):
        """Puts the input iterators into the checkpoint, unless the newest
        checkpoint was written with another number of replicas: then its data
        positions mean nothing here, the rest resumes and the data order restarts."""
        previous = self.checkpoints.checkpointed_value("train_replicas", default=1)
        if previous is None or previous == self.replicas:
            for name, iterator in inputs.checkpoint_items().items():
                setattr(self.checkpoint, name, iterator)
            return
        per_replica = self.hp.batch_size * self.n
        logging.warning(
            "Resuming a run trained on %d replica(s) on %d: tokens per update change "
            "from %d to %d (batch_size %d × %d accumulation steps × replicas); the "
            "training data order restarts.",
            previous,
            self.replicas,
            per_replica * previous,
            per_replica * self.replicas,
            self.hp.batch_size,
            self.n,
        )
        self.checkpoints.allow_partial()

    def _loop(self, inputs, start, stop):
        config = self.config
        meter = ThroughputMeter(start, config.train_steps)
        record, last_saved = None, start
        many_workers = num_workers(self.strategy) > 1
        for step in range(start, config.train_steps):
            began = time.perf_counter()
            batch = inputs.next()
            self._notify("on_input", time.perf_counter() - began)
            if many_workers and stop.requested:
                self.step.request_stop()
            began = time.perf_counter()
            out = self.step(batch, step)
            self._notify("on_step", step, time.perf_counter() - began)
            meter.add(out)
            done, record = step + 1, None
            saving = done % config.save_checkpoints_steps == 0
            logging_now = done % config.log_steps == 0 or done == config.train_steps
            if logging_now or saving or stop.requested:
                self.run_log.check_divergence(done)
            if logging_now:
                self.run_log.training(meter, done)
            # A signal may arrive at any point above: read the stop request only
            # here, once, so a stop always comes with a checkpoint of this very step.
            # On many workers, all stop at the update where any of them asked to.
            stopping = stop.requested
            if many_workers:
                votes = out.get("stop_votes")
                stopping = bool(votes and float(votes[0]) > 0) and (stopping or "peer")
            if saving or stopping:
                self.save()
                last_saved = done
            if stopping:
                peer = "early stopping" if self.early_stopped else "another worker"
                self.stopped_by = stopping if stopping != "peer" else peer
                return None
            if config.local_eval_frequency and done % config.local_eval_frequency == 0:
                record = self.evaluate(stop=stop)
                evaluated = bool(record and "loss" in record)  # the chief's, in full
                if evaluated and self.run_state.should_stop_early(done):
                    if not many_workers:
                        self.run_state.checkpoint_of(done)  # saved unless it was
                        return record
                    self.step.request_stop()  # every worker stops at the next update
        if last_saved != config.train_steps:
            self.save()
        record = record or self.evaluate(stop=stop)
        if record is None:  # stopped during the final evaluation; already saved
            self.stopped_by = stop.requested
        return record
