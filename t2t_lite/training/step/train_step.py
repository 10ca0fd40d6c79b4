"""The compiled training step with exact gradient accumulation (docs/design.md §2).

Two compiled functions share one replica-level body:

- `accumulate(batch)`: forward/backward on one micro-batch, add into the replica-local
  accumulators. No cross-replica communication.
- `accumulate_and_update(batch)`: the same, then ONE all-reduce of gradients, token
  count and loss; gradient = sum / tokens (token-exact); weight decay, then global-norm
  clipping, once, on that gradient; the optimizer applies it; accumulators reset.

Windows (docs/design.md §2.7): `windows()` yields each accumulation window's size,
decided when it starts by the run's plan (optim/batch_schedule.py: a fixed n, a
batch-size schedule or an adaptive batch), and the position inside it; the loop
calls `accumulate` for all but the window's last micro-batch and
`accumulate_and_update` for the last. Size and position are checkpointed, so a run
resumed mid-window finishes the window it was in. With a fixed n of 1 there are no
accumulators: the update body uses the micro-batch's gradient directly.

The gradient noise scale (training/step/noise_scale.py) is measured on the way when a
window holds more than one micro-batch: a squared norm per micro-batch, summed into
replica-local statistics that ride the update's all-reduce.

Since the optimizer only runs on updates, `optimizer.iterations` *is* the update step:
the learning-rate schedule and Adam's bias correction both count updates.

Distribution: the bodies run under `strategy.run`, accumulators are ON_READ
(replica-local) variables, and the update does one all-reduce of gradients + token
count + loss, after which the optimizer applies without reducing again. The same
all-reduce carries each worker's stop request (`request_stop`), so on many hosts a
SIGTERM on one of them stops all of them at the same update, with no extra
communication. Tested with MirroredStrategy over logical CPUs and with
MultiWorkerMirroredStrategy across processes.

Out of memory: a micro-batch whose step raises ResourceExhaustedError is split by
sentences and accumulated in halves (training/step/out_of_memory.py). For that, a failed
call must leave the state as it was: every write waits for the forward and backward
pass of every local replica (`_computed`), an update's other writes wait for the
optimizer's apply, and the counters for the body's outputs.

Mixed precision: the model computes in its policy's dtype; gradients, accumulators and
all update arithmetic are float32. Under float16 a `DynamicLossScale`
(training/step/loss_scale.py) scales each micro-batch's loss in `_gradients`; `_update`
unscales once, on the summed gradient, and an overflow skips the whole update.
"""

import tensorflow as tf
from absl import logging

from t2t_lite.graph import graph_function
from t2t_lite.models.losses import token_loss
from t2t_lite.optim.accumulator import GradientAccumulator
from t2t_lite.optim.batch_plan import FixedWindows
from t2t_lite.optim.optimizers import skip_keras_all_reduce
from t2t_lite.optim.schedule import BatchClock
from t2t_lite.optim.weight_decay import add_weight_decay
from t2t_lite.training.step import out_of_memory
from t2t_lite.training.step.noise_scale import NoiseScale
from t2t_lite.training.step.traced_once import TracedOnce

# Checkpoint items newer than some checkpoints in existence: restoring a checkpoint
# without one leaves it at its initial value (runs/checkpoints.py, `optional`).
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

_BATCH_SIGNATURE = (
    {
        "inputs": tf.TensorSpec([None, None], tf.int32),
        "targets": tf.TensorSpec([None, None], tf.int32),
    },
)


class TrainStep:
    """Owns the global step and accumulators; calls model, loss and optimizer."""

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
        if windows is None:
            if accumulate_steps is None or accumulate_steps < 1:
                raise ValueError(
                    f"accumulate_steps must be >= 1, got {accumulate_steps}."
                )
            windows = FixedWindows(accumulate_steps, 0)
        self.model = model
        self.optimizer = optimizer
        self.plan = windows
        self.label_smoothing = label_smoothing
        self.clip_grad_norm = clip_grad_norm
        self.weight_decay = weight_decay
        self.loss_scale = loss_scale
        self.strategy = strategy or tf.distribute.get_strategy()
        with self.strategy.scope():
            self.global_step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            # Divergence guard: updates skipped because the window's loss or gradient
            # was NaN/Inf, in a row (reset by a good update) and in total.
            self.bad_updates_in_a_row = _counter("bad_updates_in_a_row")
            self.skipped_updates = _counter("skipped_updates")
            # Applied updates whose gradient norm exceeded clip_grad_norm (> 0).
            self.clipped_updates = _counter("clipped_updates")
            # The current window: its size (0 = not recorded, a checkpoint from
            # before windows could vary: then size n and position global_step mod n)
            # and the micro-batches of it consumed.
            self.window_size = _counter("window_size")
            self.window_position = _counter("window_position")
            self.tokens_seen = _counter("tokens_seen")  # non-pad target tokens
            # Micro-batches (or parts of one) split because they ran out of memory.
            self.oom_splits = _counter("oom_splits")
            can_vary = not windows.constant or windows.n > 1
            self.noise_scale = None
            if noise_scale_decay is not None and (
                can_vary or self.strategy.num_replicas_in_sync > 1
            ):
                self.noise_scale = NoiseScale(noise_scale_decay)
            if windows.state is None:
                windows.create_state()  # e.g. an adaptive plan's target
            self.clock = clock or BatchClock()
            self.optimizer.build(model.trainable_variables)
            skip_keras_all_reduce(self.optimizer)
            self.accumulator = (
                GradientAccumulator(model.trainable_variables) if can_vary else None
            )
        # This process's vote to stop, summed over all replicas by the update's
        # all-reduce. A plain local variable: each worker sets its own.
        self._stop_vote = tf.Variable(0.0, trainable=False, name="stop_vote")
        # Replicas inside the optimizer's apply right now: non-zero after a call
        # that failed there, when the weights may be partly updated.
        self._applying = tf.Variable(0, trainable=False, name="applying")
        self.jit_compile = jit_compile
        if jit_compile:  # XLA: see _compile
            self._gradients = graph_function(self._gradients, jit_compile=True)
        # Tests and benchmarks set a training/out_of_memory.SimulatedMemory here.
        self.simulated_memory = None
        self.recompile()

    def recompile(self):
        """(Re)creates the compiled functions: they trace on their next call, with
        the step's current plan, schedule and accumulators."""
        self.accumulate = self._compile(self._accumulate_body, closes_window=False)
        self.accumulate_and_update = self._compile(
            self._update_body, closes_window=True
        )
        # The halves of a split micro-batch but the last: accumulate, no micro-step.
        self.accumulate_part = self._compile(
            self._accumulate_body, closes_window=False, advances=False
        )

    @property
    def n(self):
        """The fixed n, or None when windows vary."""
        return self.plan.n if self.plan.constant else None

    def set_plan(self, plan):
        """Trains on with `plan` (a re-planned run, training/opening/build.py replan): it
        keeps the old plan's checkpointed state, and the step is traced anew."""
        plan.adopt_state(self.plan)
        self.plan = plan
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
        """One micro-step of the current window; the last one updates. A micro-batch
        that does not fit in memory is split (training/step/out_of_memory.py)."""
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
        (a fixed n of 1) creates them: the halves need somewhere to add up."""
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
            with self.strategy.scope():
                self.accumulator = GradientAccumulator(self.model.trainable_variables)
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
        self._stop_vote.assign(1.0)

    def __call__(self, batch, global_step):
        """Runs micro-step `global_step`; returns {"loss_sum", "tokens"} of this
        batch (one tensor per local replica). An update also returns, summed over the
        window and all replicas, "window_loss_sum", "window_tokens" and
        "stop_votes", and "grad_norm": the global norm of the update's gradient
        before clipping (all-reduced, normalized, unscaled, weight decay added)."""
        if not self.plan.constant:
            raise TypeError("windows vary: drive them with windows() and train_on().")
        return self.train_on(batch, self.is_update_micro_step(global_step))

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
        if self.accumulator is not None:
            items["accumulator"] = self.accumulator
        if self.noise_scale is not None:
            items["noise_scale"] = self.noise_scale
        items["batch_clock"] = self.clock
        if self.plan.state is not None:
            items["adaptive_batch"] = self.plan.state
        if self.loss_scale is not None:
            items["loss_scale"] = self.loss_scale
        return items

    def _compile(self, body, closes_window, advances=True):
        """One trace for all batch shapes: a [None, None] signature on one replica;
        distributed (PerReplica) batches get the same, built from the first batch.

        With jit_compile, `_gradients` (model, loss and tape.gradient: the replica's
        forward and backward) is an XLA-compiled function nested in this one; XLA
        compiles it once per batch shape it meets (pad batches to their bucket,
        data.pipeline's pad_to_bucket, to get one shape per bucket). Accumulation,
        the all-reduce and the optimizer stay outside XLA: tf.distribute's
        collectives cannot be compiled, and on a CPU an XLA-compiled update (dense
        Adam, scatter_add into the accumulators) measured slower than TF's kernels.
        """
        if self.strategy.num_replicas_in_sync == 1:
            return graph_function(
                self._run(body, closes_window, advances),
                input_signature=_BATCH_SIGNATURE,
            )
        return TracedOnce(self._run(body, closes_window, advances), self.strategy)

    # --- replica-level bodies -------------------------------------------------------

    def _run(self, body, closes_window, advances):
        """Wraps a replica body: no cross-replica reduction of its outputs.

        The per-replica loss sums and token counts are returned as they are (a tuple
        of one tensor per local replica) and added on the host when a log line is
        written, and `global_step` and the window position move in cross-replica
        context, so nothing is communicated between replicas on a micro-step that
        is not an update. The counters move only once the body has finished (a call
        that fails part-way has not taken its micro-step), and not at all for a
        part of a split micro-batch (`advances` False).
        """

        def run(batch):
            outputs = self.strategy.run(body, args=(batch,))
            outputs = {
                k: tuple(self.strategy.experimental_local_results(v))
                for k, v in outputs.items()
            }
            if advances:
                with tf.control_dependencies(tf.nest.flatten(outputs)):
                    self.global_step.assign_add(1)
                    if closes_window:
                        self.window_position.assign(0)
                    else:
                        self.window_position.assign_add(1)
            return outputs

        return run

    def _gradients(self, batch):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(batch, training=True)  # [batch, length, vocab]
            loss_sum, tokens = token_loss(
                logits, batch["targets"], self.label_smoothing
            )
            scaled = loss_sum
            if self.loss_scale is not None:
                scaled = self.loss_scale.scale_loss(loss_sum)
        return tape.gradient(scaled, variables), loss_sum, tokens

    def _computed(self, batch):
        """Gradients, loss sum and tokens of this replica's micro-batch, available
        once every local replica's forward and backward pass is done: a replica
        whose step fails must not leave the others' accumulators written."""
        gradients, loss_sum, tokens = _complete(*self._gradients(batch))
        if self.strategy.num_replicas_in_sync == 1:
            return gradients, loss_sum, tokens
        all_done = tf.distribute.get_replica_context().merge_call(
            _sum_of_local, args=(tokens,)
        )  # adds the local replicas' token counts: no communication between hosts
        with tf.control_dependencies([all_done]):
            return gradients, tf.identity(loss_sum), tf.identity(tokens)

    def _accumulate_body(self, batch):
        gradients, loss_sum, tokens = self._computed(batch)
        with tf.control_dependencies([tokens]):
            self.accumulator.add(gradients, loss_sum, tokens)
            if self.noise_scale is not None:
                self.noise_scale.add(NoiseScale.micro_batch(gradients, tokens))
        return {"loss_sum": loss_sum, "tokens": tokens}

    def _update_body(self, batch):
        gradients, loss_sum, tokens = self._computed(batch)
        noise = None
        if self.noise_scale is not None:
            noise = self.noise_scale.window(NoiseScale.micro_batch(gradients, tokens))
        if self.accumulator is None:
            window = self._update(gradients, loss_sum, tokens, noise)
        else:
            summed = self.accumulator.plus(gradients, loss_sum, tokens)
            window = self._update(*summed, noise)
        # The sums restart only once the update is done (or skipped):
        with tf.control_dependencies(tf.nest.flatten(window)):
            if self.accumulator is not None:
                self.accumulator.reset()
            if self.noise_scale is not None:
                self.noise_scale.reset_window()
        return {"loss_sum": loss_sum, "tokens": tokens, **window}

    def _update(self, gradients, loss_sum, tokens, noise=None):
        """All-reduce once, normalize by tokens, decay, clip, apply — or skip.

        A NaN/Inf loss, gradient norm or learning rate skips the whole update
        (weights, slots and the update count stay as they were) and is counted; the
        loop stops the run after `max_consecutive_bad_updates` in a row. Under loss
        scaling, a finite loss with a non-finite gradient is an overflow instead: the
        update is skipped and the scale lowered (see training/step/loss_scale.py).
        Returns the window's all-reduced loss sum, token count and stop votes (and
        the noise scale when measured: `noise` holds this replica's window sums).
        """
        context = tf.distribute.get_replica_context()
        votes = tf.identity(self._stop_vote)
        scalars = [loss_sum, tokens, votes] + list(noise or [])
        reduced = context.all_reduce(
            tf.distribute.ReduceOp.SUM, list(gradients) + scalars
        )
        gradients, scalars = reduced[: len(gradients)], reduced[len(gradients) :]
        (loss_sum, tokens, votes), noise = scalars[:3], scalars[3:]
        # Dense from here on: Keras 3 optimizers treat IndexedSlices lazily (moments of
        # rows absent from the batch are not decayed), which would make an accumulated
        # update differ from the big-batch one. Dense is T2T's MultistepAdam (T2T's
        # plain "adam" is LazyAdam). Densifying once per update costs one vocab×hidden
        # add; the micro-steps stay sparse.
        scale = 1.0 / tf.maximum(tokens, 1.0)
        if self.loss_scale is not None:
            scale *= self.loss_scale.unscale_factor()
        gradients = [tf.convert_to_tensor(g) * scale for g in gradients]
        variables = self.model.trainable_variables
        norm = unclipped = tf.linalg.global_norm(gradients)  # before weight decay
        if self.weight_decay > 0:
            gradients = [
                add_weight_decay(g, v, self.weight_decay)
                for g, v in zip(gradients, variables)
            ]
            norm = tf.linalg.global_norm(gradients)
        clipped = tf.constant(False)
        if self.clip_grad_norm > 0:
            clipped = tf.math.is_finite(norm) & (norm > self.clip_grad_norm)
            gradients, _ = tf.clip_by_global_norm(
                gradients, self.clip_grad_norm, use_norm=norm
            )
        rate = tf.convert_to_tensor(self.optimizer.learning_rate)
        finite_loss = tf.math.is_finite(loss_sum) & tf.math.is_finite(
            tf.cast(rate, tf.float32)
        )
        finite_gradients = tf.math.is_finite(norm)
        overflow = tf.constant(False)
        if self.loss_scale is not None:
            overflow = finite_loss & ~finite_gradients & self.loss_scale.can_lower()
        done = self._apply_or_skip(
            finite_loss & finite_gradients, overflow, gradients, clipped
        )
        # What else this update writes waits for the apply (or skip), so that a
        # call that fails before it has written nothing (training/step/out_of_memory.py).
        with tf.control_dependencies([done]):
            self.tokens_seen.assign_add(tf.cast(tokens, tf.int64))
            self._count_planned(finite_loss & finite_gradients, rate)
            measured = {}
            if noise:
                measured["noise_scale"] = self._measure_noise(unclipped, tokens, noise)
            return {
                "window_loss_sum": tf.identity(loss_sum),
                "window_tokens": tf.identity(tokens),
                "stop_votes": tf.identity(votes),
                "grad_norm": tf.identity(norm),
                **measured,
            }

    def _count_planned(self, applied, rate):
        """An applied update adds its window's planned tokens to the clock and
        records its rate; a skipped one neither (it is retried)."""
        clock = self.clock
        window = tf.convert_to_tensor(clock.window_tokens)
        clock.tokens_trained.assign_add(
            tf.where(applied, window, tf.zeros_like(window))
        )
        previous = tf.convert_to_tensor(clock.applied_rate)
        clock.applied_rate.assign(
            tf.where(applied, tf.cast(rate, tf.float32), previous)
        )

    def _measure_noise(self, norm, tokens, noise):
        """The noise scale after folding in this update (`norm`: the global norm
        of the window's normalized, unscaled gradient, before weight decay)."""
        square_sum, inverse_tokens, count = noise
        if self.loss_scale is not None:  # micro-batch norms were of scaled losses
            square_sum *= tf.square(self.loss_scale.unscale_factor())
        big_square = tf.square(norm)
        valid = tf.math.is_finite(big_square) & tf.math.is_finite(square_sum)
        return self.noise_scale.update(
            square_sum, inverse_tokens, count, big_square, tokens, valid
        )

    def _apply_or_skip(self, finite, overflow, gradients, clipped):
        """tf.cond(finite, apply, skip), placed where tf.distribute allows it; a
        skip is an overflow (lower the loss scale) or a bad update (count it).

        Keras's apply synchronizes replicas (merge_call), which tf.distribute forbids
        inside a tf.cond in replica context; then the cond runs in cross-replica
        context around a per-replica apply, as Keras's LossScaleOptimizer does.
        `finite` and `overflow` are the same on every replica (they come from
        all-reduced values), as is `clipped` (an applied update is counted in
        `clipped_updates` when it is). Returns a value read after it, for what
        must wait until the update is done.
        """
        variables = self.model.trainable_variables

        def apply(gradients, clipped):
            entered = self._applying.assign_add(1)
            with tf.control_dependencies([entered]):
                self.optimizer.apply(gradients, variables)
            # Reads after the writes they follow (automatic control dependencies):
            applied = [tf.identity(v.value) for v in variables]
            with tf.control_dependencies(applied):
                self._applying.assign_add(-1)
            self.bad_updates_in_a_row.assign(0)
            if self.clip_grad_norm > 0:
                self.clipped_updates.assign_add(tf.cast(clipped, tf.int64))
            if self.loss_scale is not None:
                self.loss_scale.on_applied()

        def bad_update():
            self.bad_updates_in_a_row.assign_add(1)
            self.skipped_updates.assign_add(1)

        def skip(overflow):
            if self.loss_scale is None:
                return bad_update()
            return tf.cond(overflow, self.loss_scale.on_overflow, bad_update)

        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            tf.cond(finite, lambda: apply(gradients, clipped), lambda: skip(overflow))
            return self._applying.read_value()  # a read after the cond

        def cross_replica(distribution, finite, overflow, gradients, clipped):
            finite = distribution.experimental_local_results(finite)[0]
            overflow = distribution.experimental_local_results(overflow)[0]
            tf.cond(
                finite,
                lambda: distribution.extended.call_for_each_replica(
                    apply, args=(gradients, clipped)
                ),
                lambda: skip(overflow),
            )

        tf.distribute.get_replica_context().merge_call(
            cross_replica, args=(finite, overflow, gradients, clipped)
        )
        return self._applying.read_value()  # a read after the cond


def _complete(gradients, loss_sum, tokens):
    """The micro-batch's gradients, loss and tokens, available only once all of
    them are computed. Without this, writes fed by the gradients computed first
    (accumulator adds, the noise scale's sums) could run while the backward pass
    is still going, and a call that then runs out of memory would leave them
    half done. It keeps the micro-batch's gradients alive together, as an update
    does anyway; the activations are mostly freed by then."""
    tensors = [loss_sum, tokens] + [
        t
        for g in gradients
        if g is not None
        for t in tf.nest.flatten(g, expand_composites=True)
    ]
    with tf.control_dependencies(tensors):
        gradients = [
            None
            if g is None
            else tf.nest.map_structure(tf.identity, g, expand_composites=True)
            for g in gradients
        ]
        return gradients, tf.identity(loss_sum), tf.identity(tokens)


def _sum_of_local(distribution, tokens):
    """merge_call: the local replicas' token counts added (a value that exists once
    every local replica has computed its own)."""
    return tf.add_n(
        [tf.identity(t) for t in distribution.experimental_local_results(tokens)]
    )


def _counter(name):
    return tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
