"""What runs per replica inside the compiled train step (docs/design.md §2).

- `accumulate(batch)`: forward/backward on one micro-batch, add into the replica-local
  accumulators. No cross-replica communication.
- `update(batch)`: the same, then ONE all-reduce of gradients, token count, loss and
  stop votes (none on one replica); gradient = sum / tokens (token-exact); weight
  decay, then global-norm clipping, once, on that gradient; the optimizer applies it
  (or the update is skipped); accumulators reset. Without accumulators (a fixed n of
  1 on one host) the update uses the micro-batch's gradient directly.

Since the optimizer only runs on updates, `optimizer.iterations` *is* the update step:
the learning-rate schedule and Adam's bias correction both count updates.

A failed call must leave the state as it was, so that a micro-batch that ran out of
memory can be split and retried (training/step/out_of_memory.py): every write waits
for the forward and backward pass of every local replica (`computed`), and an
update's other writes wait for the optimizer's apply.

Mixed precision: the model computes in its policy's dtype; gradients, accumulators and
all update arithmetic are float32. Under float16 a `DynamicLossScale`
(training/step/loss_scale.py) scales each micro-batch's loss in `gradients`; the
update unscales once, on the summed gradient, and an overflow skips the whole update.
"""

import tensorflow as tf

from t2t_lite.graph import graph_function
from t2t_lite.models.losses import token_loss
from t2t_lite.optim.weight_decay import add_weight_decay
from t2t_lite.training.step.noise_scale import NoiseScale


class ReplicaStep:
    """The per-replica bodies the host-side TrainStep compiles and calls."""

    def __init__(
        self,
        model,
        optimizer,
        counters,
        *,
        label_smoothing,
        clip_grad_norm,
        weight_decay,
        loss_scale,
        noise_scale,
        clock,
        strategy,
        jit_compile,
    ):
        """counters: the step's StepCounters. noise_scale: a NoiseScale, or None.
        clock: the BatchClock the learning rate reads. jit_compile: XLA-compile
        `gradients` (see TrainStep._compile)."""
        self.model = model
        self.optimizer = optimizer
        self.counters = counters
        self.label_smoothing = label_smoothing
        self.clip_grad_norm = clip_grad_norm
        self.weight_decay = weight_decay
        self.loss_scale = loss_scale
        self.noise_scale = noise_scale
        self.clock = clock
        self.strategy = strategy
        # The GradientAccumulator, set by the host (TrainStep._create_accumulator);
        # None while a one-host run's windows hold one micro-batch and none split.
        self.accumulator = None
        # A function of its own, which both compiled step functions call, so that
        # the model's forward and backward pass is traced once, not once for each:
        # tracing the model is most of what a new run pays before its first update.
        # TF inlines the call when it runs the graph; with jit_compile, XLA compiles
        # it instead.
        self.gradients = graph_function(self.gradients, jit_compile=jit_compile)

    def gradients(self, batch):
        """(gradients, loss sum, non-pad tokens) of this replica's micro-batch."""
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

    def computed(self, batch):
        """Gradients, loss sum and tokens of this replica's micro-batch, available
        once every local replica's forward and backward pass is done: a replica
        whose step fails must not leave the others' accumulators written."""
        gradients, loss_sum, tokens = _complete(*self.gradients(batch))
        if self.strategy.num_replicas_in_sync == 1:
            return gradients, loss_sum, tokens
        all_done = tf.distribute.get_replica_context().merge_call(
            _sum_of_local, args=(tokens,)
        )  # adds the local replicas' token counts: no communication between hosts
        with tf.control_dependencies([all_done]):
            return gradients, tf.identity(loss_sum), tf.identity(tokens)

    def accumulate(self, batch):
        gradients, loss_sum, tokens = self.computed(batch)
        with tf.control_dependencies([tokens]):
            self.accumulator.add(gradients, loss_sum, tokens)
            if self.noise_scale is not None:
                self.noise_scale.add(NoiseScale.micro_batch(gradients, tokens))
        return {"loss_sum": loss_sum, "tokens": tokens}

    def update(self, batch):
        gradients, loss_sum, tokens = self.computed(batch)
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
        gradients, (loss_sum, tokens, votes), noise = self._all_reduced(
            gradients, [loss_sum, tokens, tf.identity(self.counters.stop_vote)], noise
        )
        unclipped = tf.linalg.global_norm(gradients)  # before weight decay
        gradients, norm, clipped = self._decayed_and_clipped(gradients, unclipped)
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
            self.counters.tokens_seen.assign_add(tf.cast(tokens, tf.int64))
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

    def _all_reduced(self, gradients, scalars, noise):
        """One all-reduce of the gradients, `scalars` and the noise sums; returns
        (the normalized, unscaled, dense gradient, scalars, noise sums)."""
        reduced = list(gradients) + scalars + list(noise or [])
        if self.strategy.num_replicas_in_sync > 1:  # else the sum is the value itself
            reduced = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, reduced
            )
        first, last = len(gradients), len(gradients) + len(scalars)
        gradients, scalars, noise = reduced[:first], reduced[first:last], reduced[last:]
        # Dense from here on: Keras 3 optimizers treat IndexedSlices lazily (moments of
        # rows absent from the batch are not decayed), which would make an accumulated
        # update differ from the big-batch one. Dense is T2T's MultistepAdam (T2T's
        # plain "adam" is LazyAdam). Densifying once per update costs one vocab×hidden
        # add; the micro-steps stay sparse.
        scale = 1.0 / tf.maximum(scalars[1], 1.0)
        if self.loss_scale is not None:
            scale *= self.loss_scale.unscale_factor()
        return [tf.convert_to_tensor(g) * scale for g in gradients], scalars, noise

    def _decayed_and_clipped(self, gradients, norm):
        """Weight decay, then global-norm clipping: (gradients, their norm after
        decay, whether they were clipped). `norm`: theirs before decay."""
        if self.weight_decay > 0:
            variables = self.model.trainable_variables
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
        return gradients, norm, clipped

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
            entered = self.counters.applying.assign_add(1)
            with tf.control_dependencies([entered]):
                self.optimizer.apply(gradients, variables)
            # Reads after the writes they follow (automatic control dependencies):
            applied = [tf.identity(v.value) for v in variables]
            with tf.control_dependencies(applied):
                self.counters.applying.assign_add(-1)
            self.counters.bad_updates_in_a_row.assign(0)
            if self.clip_grad_norm > 0:
                self.counters.clipped_updates.assign_add(tf.cast(clipped, tf.int64))
            if self.loss_scale is not None:
                self.loss_scale.on_applied()

        def bad_update():
            self.counters.bad_updates_in_a_row.assign_add(1)
            self.counters.skipped_updates.assign_add(1)

        def skip(overflow):
            if self.loss_scale is None:
                return bad_update()
            return tf.cond(overflow, self.loss_scale.on_overflow, bad_update)

        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            tf.cond(finite, lambda: apply(gradients, clipped), lambda: skip(overflow))
            return self.counters.applying.read_value()  # a read after the cond

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
        return self.counters.applying.read_value()  # a read after the cond


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
