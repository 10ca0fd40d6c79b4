"""Opening a training run: everything a run is built from, apart from running it.

`TrainerSetup(options, hp, strategy)` looks up the names, loads the problem, guards the run
directory, seeds, builds model/schedule/optimizer/train step (training/opening/build.py),
evaluators, the checkpoint keeper and the logs, and offers what the loop and the
tests do with them: restore, save, evaluate, datasets. training/loop/trainer.py adds the
loop; nothing here iterates over steps.

Distribution (a MirroredStrategy or MultiWorkerMirroredStrategy, see
training/cluster/distribution.py): every replica reads its own shard through a
checkpointed iterator (training/opening/inputs.py); every worker takes part in each save
(it gathers the replica-local sums in packed all-reduces); the chief writes the run's
files (hparams.json, run.json, metrics.jsonl, TensorBoard, checkpoints) and evaluates
while the others wait at the next all-reduce. Other workers keep their own checkpoints
(their input iterators, to resume exactly) under OUTPUT_DIR/workers/worker-I.
"""

import time

import keras
import tensorflow as tf
from absl import logging

from t2t_lite.data.pipeline import batches_from_hparams
from t2t_lite.optim.batch_plan import largest_micro_batch, plan_from_hparams
from t2t_lite.outputs import run_files
from t2t_lite.outputs.best import check_metric
from t2t_lite.outputs.checkpoints import CheckpointKeeper, InputPipelineChanged
from t2t_lite.outputs.warm_start import warm_start
from t2t_lite.registry import MODELS, PROBLEMS
from t2t_lite.training.cluster.distribution import (
    is_chief,
    num_workers,
    task,
    worker_index,
)
from t2t_lite.training.cluster.lost_worker import restore_common_step
from t2t_lite.training.opening.auto_batch import (
    AutoBatch,
    AutoBatchError,
    probe_batch_size,
)
from t2t_lite.training.opening.build import build_training, replan
from t2t_lite.training.opening.inputs import ReplicaInputs
from t2t_lite.training.opening.run_identity import identity_hints, run_identity
from t2t_lite.training.reporting.eval_tracker import EvalTracker
from t2t_lite.training.reporting.evaluation import BleuEvaluator, Evaluator
from t2t_lite.training.reporting.reporter import Reporter, check_train_steps_change
from t2t_lite.training.step.train_step import OPTIONAL_CHECKPOINT_ITEMS


class TrainerSetup:
    """A run opened: its TrainingParts (`self.parts`: model, schedule, optimizer,
    train step), evaluators, checkpoints and logs, and what is done with them
    between steps.

    hooks: objects with any of on_input(seconds), on_step(step, seconds),
    on_save(seconds), on_evaluate(seconds) (profiling, see scripts/) and the loop's
    events (training/loop/hooks.py); `notify` calls them.
    """

    def __init__(self, options, hp, strategy=None, hooks=(), simulated_memory=None):
        """options: a TrainerOptions (checked when built); hp: validated hparams
        (bin/trainer.py's build_hparams parses and checks them). simulated_memory:
        a training/out_of_memory.SimulatedMemory (tests and benchmarks)."""
        self.options, self.hooks = options, list(hooks)
        # hparams as given (hparams.json); self.hp has batch_size=0 (auto) resolved.
        self.given_hp = self.hp = hp
        self.stopped_by = None  # the signal's name when a SIGTERM/SIGINT ended train()
        self.input_pipeline_changed = False  # set by restore(): data order restarts
        self.strategy = strategy or tf.distribute.get_strategy()
        self.replicas = self.strategy.num_replicas_in_sync
        self.chief = is_chief(self.strategy)
        self.workers = num_workers(self.strategy)
        self.task = task(self.strategy)  # (type, index) in TF_CONFIG's cluster
        self.problem = self._load_problem()
        self.parts, self.auto_batch = None, None
        if hp.batch_size == 0:
            self._open_auto_batch(simulated_memory)  # builds the parts, resolves hp
            hp = self.hp
        # The batch plan, checked on this replica count before anything is
        # written; the parts are built with it (after the probe, it is the
        # re-planned parts'):
        self.plan = (
            self.parts.step.plan if self.parts else plan_from_hparams(hp, self.replicas)
        )
        self.plan.check_workers(self.workers)
        self.n = self.plan.n if self.plan.constant else None  # None: windows vary
        # Best checkpoint, early stopping, elapsed time (reporting/eval_tracker.py):
        self.eval_tracker = EvalTracker(
            options.output_dir,
            options.eval_early_stopping_metric,
            options.eval_early_stopping_metric_minimize,
            options.eval_early_stopping_steps,
            save=self.save,
            workers=self.workers,
        )
        if self.chief:
            self._guard_output_dir()
        if self.parts is None:
            self.parts = self._build(hp, self.plan)
        self.model, self.optimizer = self.parts.model, self.parts.optimizer
        self.schedule, self.step = self.parts.schedule, self.parts.step
        self.step.simulated_memory = simulated_memory
        self.evaluator = Evaluator(self.model, hp.label_smoothing)
        self.bleu_evaluator = self._bleu_evaluator()
        self.checkpoint = self.parts.checkpoint()
        self.checkpoints = CheckpointKeeper(
            self.checkpoint,
            self._checkpoint_dir(),
            options.keep_checkpoint_max,
            self.model.trainable_variables,
            keep_every_n_hours=options.keep_checkpoint_every_n_hours,
            optional=OPTIONAL_CHECKPOINT_ITEMS,
            stand_ins=self.step.checkpoint_stand_ins,
        )
        # TensorBoard, log lines, skipped updates (reporting/reporter.py):
        self.reporter = Reporter(
            options.output_dir, self.chief, self.parts, hp, self.checkpoints
        )

    # --- opening ------------------------------------------------------------------

    def _load_problem(self):
        """The problem with its data, and every name checked before anything is
        written: a test split if asked for, the model, the early-stopping metric."""
        options = self.options
        problem = PROBLEMS.get(options.problem)()
        problem.load(options.data_dir or None)
        self.eval_split = "test" if options.eval_use_test_set else "dev"
        if options.eval_use_test_set:
            problem.require_split("test")
        MODELS.get(options.model)
        check_metric(
            options.eval_early_stopping_metric,
            bool(options.eval_bleu_sentences and problem.reports_bleu),
        )
        return problem

    def _guard_output_dir(self):
        """hparams.json, run.json and train_steps of an existing run must agree
        (outputs/run_files.py): a resume never mixes two different runs."""
        options = self.options
        run_files.prepare_output_dir(options.output_dir, self.given_hp)
        run_files.check_run_identity(
            options.output_dir,
            run_identity(
                options, self.problem, self.hp, self.n, self.replicas, self.auto_batch
            ),
            hints=identity_hints(self.hp, self.replicas),
        )
        check_train_steps_change(
            options.output_dir,
            run_files.record_train_steps(options.output_dir, options.train_steps),
            options.train_steps,
            self.hp,
        )

    def _build(self, hp, plan=None):
        """The TrainingParts, seeded: the same initial weights and dropout generators
        whatever happened before in this process."""
        if self.options.deterministic:
            tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(self.options.random_seed)
        return build_training(
            hp,
            vocab_size=self.problem.vocab_size,
            train_steps=self.options.train_steps,
            model=self.options.model,
            strategy=self.strategy,
            jit_compile=self.options.xla,
            plan=plan,
        )

    def _open_auto_batch(self, simulated_memory):
        """batch_size=0: the parts are built with one sentence per micro-batch,
        their own step probes the largest that fits (opening/auto_batch.py; the
        state is put back afterwards), and they are re-planned for it. A
        resume takes the micro-batch run.json recorded instead of probing."""
        options = self.options
        if self.chief:  # other hparams are refused before the probe, writing nothing
            run_files.check_hparams(options.output_dir, self.given_hp)
        stored = run_files.read_run_file(options.output_dir).get("auto_batch")
        if stored is None and self.workers > 1:
            raise AutoBatchError(
                "batch_size=0 (auto) probes the devices of one host; on several "
                "hosts give batch_size (the probe's result on one host, for one)."
            )
        provisional = self.hp.copy().override(batch_size=self.hp.max_length + 1)
        self.parts = self._build(provisional)
        if stored is not None:
            found = AutoBatch.from_record(stored, options.output_dir)
            logging.info("%s (recorded in run.json when the run started)", found.line())
        else:
            found = probe_batch_size(
                self.parts,
                memory_budget_gb=options.memory_budget,
                headroom=options.memory_headroom,
                tokens_per_update=largest_micro_batch(self.hp, self.replicas),
                simulated_memory=simulated_memory,
            )
            logging.info(found.line())
        self.hp = self.hp.copy().override(batch_size=found.batch_size)
        replan(self.parts, self.hp, options.train_steps)
        self.auto_batch = found

    def _bleu_evaluator(self):
        """BLEU at evaluation, on the chief, for problems with dev text."""
        options = self.options
        if not (
            options.eval_bleu_sentences and self.problem.reports_bleu and self.chief
        ):
            return None
        return BleuEvaluator(
            self.model,
            self.problem,
            options.decode_hparams(),
            options.eval_bleu_sentences,
            max_input_length=self.hp.max_length or self.hp.batch_size,
            split=self.eval_split,
        )

    def _checkpoint_dir(self):
        path = run_files.worker_checkpoint_dir(
            self.options.output_dir, worker_index(self.strategy)
        )
        tf.io.gfile.makedirs(path)
        return path

    @property
    def best(self):
        """The run's BestCheckpoint (outputs/best.py); bin/trainer.py reports it."""
        return self.eval_tracker.best

    @property
    def early_stopped(self):
        """Why early stopping ended train(), or None."""
        return self.eval_tracker.early_stopped

    def notify(self, event, *args):
        """Calls `event` on every hook that has it, in order."""
        for hook in self.hooks:
            method = getattr(hook, event, None)
            if method:
                method(*args)

    # --- checkpoints --------------------------------------------------------------

    def restore(self):
        """Restores the newest readable checkpoint, if any; returns the global step.
        Without one, a warm start (options.warm_start_from) loads model weights."""
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
            path = self.checkpoints.restore_newest_readable(
                root=self.parts.checkpoint()
            )
            self.input_pipeline_changed = True
        if self.workers > 1:
            path = restore_common_step(self, path)
        if path is None and self.options.warm_start_from:
            warm_start(
                self.model,
                self.options.warm_start_from,
                self.problem.vocab_fingerprint(),
            )
        # This run's replica count, not the restored checkpoint's:
        self.parts.replicas_variable.assign(self.replicas)
        if path:
            logging.info(
                "Resumed from %s (global step %d, update %d).",
                path,
                self.step.micro_step,
                self.step.update_step,
            )
        return self.step.micro_step

    def resume(self):
        """Input iterators in the checkpoint, then the restore: (inputs, start step).

        The iterators are checkpointed with the model (shuffle buffer and bucket
        contents included), so a resumed run sees exactly the batches an
        uninterrupted run would have seen next."""
        inputs = ReplicaInputs(self.strategy, self._replica_train_dataset)
        self._attach_iterators(inputs)
        start = self.restore()
        if self.input_pipeline_changed:  # the failed iterator restore may have left
            inputs = ReplicaInputs(self.strategy, self._replica_train_dataset)
            self._attach_iterators(inputs)  # them half-restored: start them afresh
        self.eval_tracker.recover(start)
        return inputs, start

    def _attach_iterators(self, inputs):
        """Puts the input iterators into the checkpoint, unless the newest
        checkpoint was written with another number of replicas: then its data
        positions mean nothing here, the rest resumes and the data order restarts."""
        previous = self.checkpoints.checkpointed_value("train_replicas", default=1)
        if previous is None or previous == self.replicas:
            for name, iterator in inputs.checkpoint_items().items():
                setattr(self.checkpoint, name, iterator)
            return
        per_replica = self.hp.batch_size * self.n  # a fixed n: the run identity
        logging.warning(  # refuses a replica change that would change n otherwise
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

    def save(self):
        """Writes a checkpoint at the current step; returns its path (None if the
        weights were not finite and nothing was written). Every worker must call it
        at the same step."""
        started = time.perf_counter()
        path = self.checkpoints.save(self.step.micro_step)
        if path and self.chief:
            logging.info("Saved checkpoint %s.", path)
        self.notify("on_save", time.perf_counter() - started)
        return path

    # --- data ---------------------------------------------------------------------

    def dataset(self, split, training, seed=None, replica=0, num_replicas=1):
        """Token-batched `split`; for training, shard `replica` of `num_replicas`
        (padded to bucket lengths under XLA: one compiled shape per bucket)."""
        return batches_from_hparams(
            self.problem,
            self.hp,
            split,
            data_dir=self.options.data_dir or None,
            training=training,
            seed=seed,
            replica=replica,
            num_replicas=num_replicas,
            pad_to_bucket=training and self.options.xla,
        )

    def _replica_train_dataset(self, replica, num_replicas):
        """Replica `replica`'s training batches: its own shard, its own shuffle seed
        (replica 0's is the single-device run's, which it then equals)."""
        return self.dataset(
            "train",
            training=True,
            seed=self.options.random_seed + replica,
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
        stopped = lambda: bool(stop and stop.requested)  # noqa: E731
        metrics = self.evaluator.evaluate(
            self.dataset(self.eval_split, training=False),
            self.options.eval_steps,
            should_stop=stopped,
            split=self.eval_split,
        )
        if metrics is None:
            return None
        if self.eval_split != "dev":
            metrics["eval_split"] = self.eval_split
        if self.bleu_evaluator:
            bleu = self.bleu_evaluator.evaluate(stopped)
            if bleu is None:
                return None
            metrics.update(bleu)
        record.update(metrics)
        record.update(self.reporter.progress_record())
        if write:
            record.update(self.eval_tracker.track_best(record))
            run_files.append_metrics(self.options.output_dir, record)
        self.reporter.evaluation(record, summaries=write)
        self.notify("on_evaluate", time.perf_counter() - started)
        return record
