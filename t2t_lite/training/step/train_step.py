"""The training step, host side: windows, calls, splits, checkpoint items
(docs/design.md §2). What runs inside the compiled step, per replica, is
training/step/replica_step.py's ReplicaStep; the counters are in counters.py.

Two compiled functions share the replica body: `accumulate(batch)` adds a
micro-batch into the replica-local accumulators, `accumulate_and_update(batch)`
adds the last one and updates (one all-reduce).

Windows (docs/design.md §2.7): `windows()` yields each accumulation window's size,
decided when it starts by the run's plan (optim/batch_plan.py: a fixed n, a
batch-size schedule or an adaptive batch), and the position inside it; the loop
calls `train_on` for each micro-batch, the window's last one updating. Size and
position are checkpointed, so a run resumed mid-window finishes the window it was
in. With a fixed n of 1 on one host there are no accumulators: the update body uses
the micro-batch's gradient directly.

The gradient noise scale (training/step/noise_scale.py) is measured on the way when
a window holds more than one micro-batch: a squared norm per micro-batch, summed
into replica-local statistics that ride the update's all-reduce.

Distribution: the bodies run under `strategy.run`, accumulators are ON_READ
(replica-local) variables, and the update does one all-reduce of gradients + token
count + loss, after which the optimizer applies without reducing again. The same
all-reduce carries each worker's stop request (`request_stop`), so on many hosts a
SIGTERM on one of them stops all of them at the same update, with no extra
communication. Tested with MirroredStrategy (logical CPUs) and across processes.

Out of memory: a micro-batch that raises ResourceExhaustedError is accumulated in
halves (training/step/out_of_memory.py); a failed call leaves the state as it was.
"""

import tensorflow as tf
from absl import logging

from t2t_lite.optim.accumulator import GradientAccumulator
from t2t_lite.optim.batch_plan import FixedWindows
from t2t_lite.optim.optimizers import skip_keras_all_reduce
from t2t_lite.optim.schedule import BatchClock
from t2t_lite.training.cluster.distribution import num_workers
from t2t_lite.training.step import out_of_memory
from t2t_lite.training.step.compiled import compiled_step
from t2t_lite.training.step.counters import StepCounters
from t2t_lite.training.step.noise_scale import NoiseScale
from t2t_lite.training.step.replica_step import ReplicaStep

# Checkpoint items newer than some checkpoints in existence: restoring a checkpoint
# without one leaves it at its initial value (outputs/checkpoints.py, `optional`).
OPTIONAL_CHECKPOINT_ITEMS = (
    "clipped_updates",
    "window_size",
    "window_position",
    "tokens_seen",
    "noise_scale",
    "adaptive_batch",
    "oom_splits",
    "batch_clock",
)


class _Counter:
    """One of the step's StepCounters, read as an attribute of the step itself."""

    def __init__(self, name=None):
        self.name = name

    def __set_name__(self, owner, name):
        self.name = self.name or name

    def __get__(self, step, owner=None):
        return self if step is None else getattr(step.counters, self.name)


class TrainStep:
    """The host side of the step: owns the counters, accumulators and noise scale
    that the per-replica body (ReplicaStep) writes, sizes the windows, calls the
    compiled functions, splits a micro-batch that ran out of memory, and lists what
    a checkpoint holds."""

    def __init__(
        self,
        model,
        optimizer,
        *,
        label_smoothing,
        accumulate_steps=None,
        windows=None,
        noise_scale_decay=None,
        clip_grad_norm=0.0,
        weight_decay=0.0,
        strategy=None,
        jit_compile=False,
        loss_scale=None,
        clock=None,
    ):
        """windows: the run's batch plan (optim/batch_plan.py), or
        accumulate_steps: a fixed n. noise_scale_decay: the moving-average decay of
        the gradient noise scale, or None not to measure it (it is not measured
        either when no window can hold two micro-batches). loss_scale: a
        DynamicLossScale (float16 training), or None. clock: the BatchClock the
        learning rate reads (optim/schedule.py), or None for one of its own."""
        windows = _fixed_windows(accumulate_steps) if windows is None else windows
        self.model = model
        self.optimizer = optimizer
        self.plan = windows
        self.loss_scale = loss_scale
        self.strategy = strategy or tf.distribute.get_strategy()
        self.counters = StepCounters(self.strategy)
        can_vary = not windows.constant or windows.n > 1
        with self.strategy.scope():
            self.noise_scale = _measured_noise(
                noise_scale_decay, can_vary or self.strategy.num_replicas_in_sync > 1
            )
            if windows.state is None:
                windows.create_state()  # e.g. an adaptive plan's target
            self.clock = clock or BatchClock()
            self.optimizer.build(model.trainable_variables)
            skip_keras_all_reduce(self.optimizer)
        self.replica = ReplicaStep(
            model,
            optimizer,
            self.counters,
            label_smoothing=label_smoothing,
            clip_grad_norm=clip_grad_norm,
            weight_decay=weight_decay,
            loss_scale=loss_scale,
            noise_scale=self.noise_scale,
            clock=self.clock,
            strategy=self.strategy,
            jit_compile=jit_compile,
        )
        self._checkpoints_accumulator = can_vary  # n=1: zero at every save
        if can_vary or num_workers(self.strategy) > 1:
            self._create_accumulator()
        # Tests and benchmarks set a training/step/out_of_memory.SimulatedMemory here.
        self.simulated_memory = None
        self.recompile()

    # The counters, read as the step's own (step.global_step, ...).
    global_step = _Counter()
    bad_updates_in_a_row = _Counter()
    skipped_updates = _Counter()
    clipped_updates = _Counter()
    window_size = _Counter()
    window_position = _Counter()
    tokens_seen = _Counter()
    oom_splits = _Counter()
    _applying = _Counter("applying")

    @property
    def accumulator(self):
        """The GradientAccumulator, or None until needed (_create_accumulator)."""
        return self.replica.accumulator

    def _create_accumulator(self):
        """Made with the step when a window can sum micro-batches, and on several
        hosts with any n: creating a variable there is a collective (the chief
        broadcasts its value) that a worker splitting a micro-batch alone (_split)
        could not make mid-run. Otherwise at a run's first split."""
        with self.strategy.scope():
            self.replica.accumulator = GradientAccumulator(
                self.model.trainable_variables
            )

    @property
    def _gradients(self):
        """The replica's forward and backward pass; tests replace it to inject
        faults (an out-of-memory error after some replicas have computed)."""
        return self.replica.gradients

    @_gradients.setter
    def _gradients(self, function):
        self.replica.gradients = function

    def recompile(self):
        """(Re)creates the compiled functions: they trace on their next call, with
        the step's current plan, schedule and accumulators."""
        self.accumulate = self._compile(self.replica.accumulate, closes_window=False)
        self.accumulate_and_update = self._compile(
            self.replica.update, closes_window=True
        )
        # The halves of a split micro-batch but the last: accumulate, no micro-step.
        self.accumulate_part = self._compile(
            self.replica.accumulate, closes_window=False, advances=False
        )

    @property
    def n(self):
        """The fixed n, or None when windows vary."""
        return self.plan.n if self.plan.constant else None

    def set_plan(self, plan, micro_batch_tokens=None):
        """Trains on with `plan` (a re-planned run, training/opening/build.py
        replan): it keeps the old plan's checkpointed state, and the step is traced
        anew. micro_batch_tokens: the most tokens a micro-batch can now hold, for
        the loss scale (float16)."""
        plan.adopt_state(self.plan)
        self.plan = plan
        if self.loss_scale is not None and micro_batch_tokens is not None:
            self.loss_scale.micro_batch_tokens = float(micro_batch_tokens)
        self.recompile()

    @property
    def update_step(self):
        """Optimizer updates applied so far, as an int (checkpointed as the optimizer's
        `iterations`, which only moves on updates)."""
        return int(tf.convert_to_tensor(self.optimizer.iterations))

    @property
    def micro_step(self):
        """Micro-batches consumed so far, as an int (checkpointed as `global_step`)."""
        return int(tf.convert_to_tensor(self.global_step))

    def is_update_micro_step(self, global_step):
        """Whether micro-step `global_step` (0-based) closes an accumulation window
        of a fixed n (windows() serves every plan)."""
        if not self.plan.constant:
            raise TypeError("windows vary: drive them with windows() and train_on().")
        return (global_step + 1) % self.n == 0

    def window(self):
        """(size, position) of the current window from the checkpointed counters
        (size 0: no window started yet)."""
        size = int(tf.convert_to_tensor(self.window_size))
        position = int(tf.convert_to_tensor(self.window_position))
        if size == 0 and self.plan.constant:  # a checkpoint from before windows
            size, position = self.n, self.micro_step % self.n
            position = position if self.micro_step else 0
        return size, position

    def windows(self, on_decision=None):
        """Yields (size, position) for the current window, then for each next one:
        the loop runs micro-steps position .. size-1 of each (the last one
        updates). A new window's size is the plan's for the update it will be
        (applied updates: a skipped one is retried at the same size), recorded in
        the checkpoint; an adaptive plan decides first, reporting (update, old,
        new tokens) to `on_decision`."""
        size, position = self.window()
        if size and position:  # resume inside a window: finish it
            self._start_window(size)
            yield size, position
        while True:
            update = self.update_step if not self.plan.constant else 0
            decision = self.plan.decide(update, self.noise_scale_value())
            if decision and on_decision:
                on_decision(update, *decision)
            size = self.plan.size(update)
            self._start_window(size)
            yield size, 0

    def _start_window(self, size):
        """Records a window of `size` micro-batches: its size in the checkpoint,
        its planned tokens for the learning rate (optim/schedule.py)."""
        self.window_size.assign(size)
        self.clock.window_tokens.assign(size * self.plan.micro_batch_tokens)

    def train_on(self, batch, closes_window):
        """One micro-step of the current window; the last one (closes_window)
        updates. A micro-batch that does not fit in memory is split
        (training/step/out_of_memory.py).

        Returns {"loss_sum", "tokens"} of this batch (one tensor per local replica);
        an update also returns, summed over the window and all replicas,
        "window_loss_sum", "window_tokens" and "stop_votes", and "grad_norm": the
        global norm of the update's gradient before clipping (all-reduced,
        normalized, unscaled, weight decay added)."""
        return self._fitted(batch, "update" if closes_window else "accumulate")

    def _fitted(self, batch, kind):
        """Runs `kind` ("accumulate", "update" or "part") on `batch`, or, when it
        runs out of memory, "part" on the first half and `kind` on the second."""
        try:
            if self.simulated_memory is not None:
                self.simulated_memory.check(batch, self.strategy)
            return self._function(kind)(batch)
        except tf.errors.ResourceExhaustedError as error:
            if int(self._applying.numpy()):
                raise out_of_memory.in_the_update(error, self.micro_step) from None
            first, second = out_of_memory.halves(batch, self.strategy, error)
            self._split(batch, first, second)
            return out_of_memory.merged(
                self._fitted(first, "part"), self._fitted(second, kind)
            )

    def probe(self, batch):
        """One accumulate-and-update step on `batch` as it is, never split: the
        auto batch size's probe (training/opening/auto_batch.py), which puts the run's
        state back afterwards. Raises ResourceExhaustedError when the step does
        not fit."""
        if self.simulated_memory is not None:
            self.simulated_memory.check(batch, self.strategy)
        return self.accumulate_and_update(batch)

    def _function(self, kind):
        return {
            "accumulate": self.accumulate,
            "update": self.accumulate_and_update,
            "part": self.accumulate_part,
        }[kind]

    def _split(self, batch, first, second):
        """Counts and logs a split; the first one of a run without accumulators
        creates them (_create_accumulator): the halves need somewhere to add up."""
        self.oom_splits.assign_add(1)
        sizes = [
            out_of_memory.padded_tokens(part, self.strategy)
            for part in (batch, first, second)
        ]
        logging.warning(
            "Out of memory at step %d on a micro-batch of %d padded tokens: "
            "accumulating it in two parts of %d and %d (%d splits so far).",
            self.micro_step,
            *sizes,
            int(tf.convert_to_tensor(self.oom_splits)),
        )
        if self.accumulator is None:
            self._create_accumulator()
            self.recompile()

    def noise_scale_value(self):
        """B_simple in tokens from the moving averages, or None when not measured
        (or not yet, or not finite)."""
        if self.noise_scale is None:
            return None
        value = float(self.noise_scale.value())
        return value if value > 0 and value != float("inf") else None

    def request_stop(self):
        """Makes the next update report `stop_votes` > 0 on every worker."""
        self.counters.stop_vote.assign(1.0)

    def checkpoint_items(self):
        """Objects a tf.train.Checkpoint must hold to resume exactly, even mid-window."""
        items = {
            "model": self.model,
            "optimizer": self.optimizer,
            "global_step": self.global_step,
            # Keras tracks non-trainable state such as the dropout SeedGenerators'
            # states outside the TF object graph; list it so it is saved too.
            "model_state": list(self.model.non_trainable_variables),
            "bad_updates_in_a_row": self.bad_updates_in_a_row,
            "skipped_updates": self.skipped_updates,
            # Added after the first checkpoints were written: optional on restore
            # (OPTIONAL_CHECKPOINT_ITEMS), an older checkpoint leaves it at 0.
            "clipped_updates": self.clipped_updates,
        }
        items.update(
            window_size=self.window_size,
            window_position=self.window_position,
            tokens_seen=self.tokens_seen,
            oom_splits=self.oom_splits,
        )
        if self._checkpoints_accumulator:
            items["accumulator"] = self.accumulator
        if self.noise_scale is not None:
            items["noise_scale"] = self.noise_scale
        items["batch_clock"] = self.clock
        if self.plan.state is not None:
            items["adaptive_batch"] = self.plan.state
        if self.loss_scale is not None:
            items["loss_scale"] = self.loss_scale
        return items

    def checkpoint_stand_ins(self):
        """What a save writes in place of checkpoint_items (CheckpointKeeper's
        stand_ins): on several replicas, the accumulators and noise-scale sums over
        all replicas, gathered at once rather than by reductions per variable."""
        if self.strategy.num_replicas_in_sync == 1:
            return {}
        items = self.checkpoint_items()
        return {
            name: items[name].summed(self.strategy)
            for name in ("accumulator", "noise_scale")
            if name in items
        }

    def _compile(self, body, closes_window, advances=True):
        """`body` compiled for this step's strategy (training/step/compiled.py)."""
        return compiled_step(
            body,
            self.strategy,
            self.counters,
            closes_window=closes_window,
            advances=advances,
        )


def _measured_noise(decay, windows_sum_gradients):
    """A NoiseScale of moving-average `decay`, or None when it is not measured:
    decay None, or no window that sums two micro-batches' gradients (on one
    replica with a fixed n of 1)."""
    if decay is None or not windows_sum_gradients:
        return None
    return NoiseScale(decay)


def _fixed_windows(accumulate_steps):
    """The plan of a step built with a fixed n (tests, benchmarks)."""
    if accumulate_steps is None or accumulate_steps < 1:
        raise ValueError(f"accumulate_steps must be >= 1, got {accumulate_steps}.")
    return FixedWindows(accumulate_steps, 0)
