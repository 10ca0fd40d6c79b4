"""A micro-batch that runs out of memory is split and accumulated in halves
(training/step/out_of_memory.py, docs/design.md §2.7): the run ends with the weights of
a run that never ran out, the counters see one micro-batch per micro-batch, and a
failed call leaves the state as it was.

Memory is limited through SimulatedMemory, which raises the ResourceExhaustedError
a device would for micro-batches over a token threshold.
"""

import numpy as np
import pytest
import tensorflow as tf
from support.accumulation_helpers import (
    build,
    tiny_hparams,
    tolerance_ratio,
    uneven_micro_batches,
)
from support.window_reference import drive, start_weights

from t2t_lite.training.step.out_of_memory import (
    MicroBatchTooLarge,
    SimulatedMemory,
    StepOutOfMemory,
    halves,
    padded_tokens,
)

STEPS = 8


def batches():
    return [
        {k: tf.constant(v) for k, v in b.items()} for b in uneven_micro_batches(STEPS)
    ]


def trained(n, memory=None):
    hp = tiny_hparams(optimizer="momentum", optimizer_multistep_accumulate_steps=n)
    model, step = build(hp, STEPS, initial_weights=list(start_weights()))
    step.simulated_memory = memory
    drive(step, batches())
    return model, step


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2])
def test_split_micro_batches_give_the_clean_run(n, caplog):
    sizes = [padded_tokens(b, tf.distribute.get_strategy()) for b in batches()]
    # Below the largest micro-batches and below some of their halves: splits
    # happen at accumulate and update micro-steps, some of them twice.
    memory = SimulatedMemory(max_tokens=sorted(sizes)[2])
    clean_model, clean = trained(n)
    caplog.set_level("WARNING")
    model, step = trained(n, memory)
    assert tolerance_ratio(model, clean_model) < 1
    assert step.micro_step == clean.micro_step == STEPS
    assert step.update_step == clean.update_step == STEPS // n
    assert int(step.tokens_seen) == int(clean.tokens_seen)
    splits = int(step.oom_splits)
    assert splits == memory.refused > sum(s > memory.max_tokens for s in sizes)
    logged = [r.getMessage() for r in caplog.records]
    logged = [m for m in logged if m.startswith("Out of memory at step")]
    assert len(logged) == splits
    assert logged[-1].endswith(f"({splits} splits so far).")
    assert int(clean.oom_splits) == 0
    if n == 1:  # the first split gave the run its accumulators
        assert clean.accumulator is None and step.accumulator is not None


def test_halves_split_sentences_and_cut_padding():
    batch = {
        "inputs": tf.constant([[5, 1, 0, 0], [5, 5, 5, 1], [1, 0, 0, 0]]),
        "targets": tf.constant([[4, 1, 0], [1, 0, 0], [4, 4, 1]]),
    }
    first, second = halves(batch, tf.distribute.get_strategy(), error=None)
    assert first["inputs"].numpy().tolist() == [[5, 1]]
    assert first["targets"].numpy().tolist() == [[4, 1]]
    assert second["inputs"].numpy().tolist() == [[5, 5, 5, 1], [1, 0, 0, 0]]
    assert second["targets"].numpy().tolist() == [[1, 0, 0], [4, 4, 1]]


def test_a_sentence_that_does_not_fit_is_one_line():
    batch = {"inputs": tf.constant([[5, 5, 1]]), "targets": tf.constant([[4, 1]])}
    error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating\nmore")
    with pytest.raises(MicroBatchTooLarge) as raised:
        halves(batch, tf.distribute.get_strategy(), error)
    message = str(raised.value)
    assert "\n" not in message
    assert "source 3 tokens, target 2 tokens" in message
    assert "OOM when allocating" in message


def test_a_failed_call_leaves_the_state_as_it_was():
    """An error raised inside the compiled step, in the backward pass, after some
    gradients exist: no accumulator, counter or noise-scale sum has moved."""
    hp = tiny_hparams(optimizer="momentum", optimizer_multistep_accumulate_steps=4)
    _, step = build(hp, STEPS)
    original, fail = step._gradients, tf.Variable(False)

    def failing_gradients(batch):
        gradients, loss_sum, tokens = original(batch)

        def check(flag, _):
            if flag:
                raise ValueError("injected failure")
            return flag

        # Fails once the first variable's gradient (the source embedding's, near
        # the end of the backward pass) exists, when most others already do.
        first = gradients[0]
        first = getattr(first, "values", first)
        ok = tf.numpy_function(check, [fail, first], tf.bool)
        with tf.control_dependencies([ok]):
            gradients[0] = tf.nest.map_structure(
                tf.identity, gradients[0], expand_composites=True
            )
        return gradients, loss_sum, tokens

    step._gradients = failing_gradients
    step.recompile()
    feed = batches()
    for closes, batch in zip([False, False], feed):
        step.train_on(batch, closes)

    def state():
        values = [step.global_step, step.window_position, step.tokens_seen]
        values += step.accumulator.gradients + [step.accumulator.tokens]
        values += list(step.noise_scale._sums())
        return [np.array(tf.convert_to_tensor(v)) for v in values]

    before = state()
    fail.assign(True)
    for closes in (False, True):
        with pytest.raises(tf.errors.OpError, match="injected failure"):
            step.train_on(feed[2], closes)
        for expected, actual in zip(before, state(), strict=True):
            np.testing.assert_array_equal(actual, expected)


def test_what_an_update_writes_waits_for_the_apply():
    """A failure inside the optimizer's apply (here: before its last variable is
    written) leaves counters, tokens seen, the noise scale and the accumulators as
    they were, and marks the step as stopped inside the apply, where a split cannot
    repair the partly updated weights: an out-of-memory error there is one line."""
    hp = tiny_hparams(optimizer="momentum", optimizer_multistep_accumulate_steps=2)
    _, step = build(hp, STEPS)
    feed = batches()
    step.train_on(feed[0], False)
    original_apply, fail = step.optimizer.apply, tf.Variable(False)

    def failing_apply(gradients, variables):
        def check(flag):
            if flag:
                raise ValueError("injected failure")
            return flag

        ok = tf.numpy_function(check, [fail], tf.bool)
        with tf.control_dependencies([ok]):
            last = tf.identity(gradients[-1])
        return original_apply(list(gradients[:-1]) + [last], variables)

    step.optimizer.apply = failing_apply
    step.recompile()
    values = [step.global_step, step.window_position, step.tokens_seen]
    values += step.accumulator.gradients + [step.accumulator.tokens]
    values += list(step.noise_scale._sums()) + [step.noise_scale.weight]
    before = [np.array(tf.convert_to_tensor(v)) for v in values]
    fail.assign(True)
    with pytest.raises(tf.errors.OpError, match="injected failure"):
        step.train_on(feed[1], True)
    for expected, variable in zip(before, values, strict=True):
        np.testing.assert_array_equal(
            np.array(tf.convert_to_tensor(variable)), expected
        )
    # (Keras's own iteration count may have moved with the weights it updated.)
    assert int(step._applying.numpy()) == 1  # entered the apply, never left it
    step.simulated_memory = SimulatedMemory(max_tokens=0)  # now run out of memory
    with pytest.raises(StepOutOfMemory, match="inside the optimizer's update") as error:
        step.train_on(feed[1], True)
    assert "\n" not in str(error.value)
