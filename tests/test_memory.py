"""What accumulation costs in memory: one float32 copy of the trainable variables (plus
two scalars), allocated once when the run is built, and nothing per micro-step.

Deterministic by construction: variable counts, shapes, dtypes, tracing counts and
the TF CPU allocator's exact live-byte counts, never timings or RSS thresholds. The
peak-memory numbers (b x n=8 vs one batch of 8b) are scripts/bench_memory.py's job.
"""

import dataclasses
import gc
import json
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from support import forked
from support.accumulation_helpers import VOCAB, tiny_hparams, uneven_micro_batches

from t2t_lite.training.opening.build import build_training

N = 4
WINDOWS = 3  # measured after the first, which traces


def _build(n, **overrides):
    return build_training(
        tiny_hparams(optimizer_multistep_accumulate_steps=n, **overrides),
        vocab_size=VOCAB,
        train_steps=3 * n,
    )


def _build_counting(n, **overrides):
    """(run, every variable created while building it), via a creator scope, so a
    variable that no attribute or checkpoint lists is counted too."""
    created = []

    def creator(next_creator, **kwargs):
        created.append(next_creator(**kwargs))
        return created[-1]

    with tf.variable_creator_scope(creator):
        run = _build(n, **overrides)
    return run, created


def _checkpointed_variables(run):
    checkpoint = run.checkpoint()  # TrackableView keeps only a weak reference
    return [
        t
        for t in tf.train.TrackableView(checkpoint).descendants()
        if isinstance(t, (tf.Variable, keras.Variable))
    ]


def _nbytes(variables):
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)


def _tensors(batches):
    return [{k: tf.constant(v) for k, v in b.items()} for b in batches]


def _live_bytes():
    gc.collect()
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_accumulators_are_one_float32_copy_of_the_trainable_variables(dtype):
    run = _build(N, activation_dtype=dtype)
    accumulator = run.step.accumulator
    trainable = run.model.trainable_variables
    assert len(accumulator.gradients) == len(trainable)
    for gradient, variable in zip(accumulator.gradients, trainable):
        assert gradient.dtype == tf.float32
        assert tuple(gradient.shape) == tuple(variable.shape), variable.path
        assert not gradient.trainable
    assert {tf.as_dtype(v.dtype) for v in trainable} == {tf.float32}
    scalars = [accumulator.loss_sum, accumulator.tokens]
    assert [(v.dtype, tuple(v.shape)) for v in scalars] == [(tf.float32, ())] * 2
    assert len(accumulator.variables) == len(trainable) + 2
    assert _nbytes(accumulator.variables) == _nbytes(trainable) + 2 * 4


def test_accumulation_adds_exactly_the_accumulator_variables():
    """Everything a run holds (model, optimizer slots, accumulators, counters), n=N
    minus n=1: the accumulators and the noise scale's six scalars (on by default
    when windows hold several micro-batches) and nothing else, all checkpointed."""
    run_1, created_1 = _build_counting(1)
    run_n, created_n = _build_counting(N)
    assert run_1.step.accumulator is None and run_1.step.noise_scale is None
    trainable = len(run_n.model.trainable_variables)
    added = run_n.step.accumulator.variables + run_n.step.noise_scale.variables
    assert len(run_n.step.noise_scale.variables) == 6
    assert len(created_n) - len(created_1) == trainable + 2 + 6 == len(added)
    extra = _checkpointed_variables(run_n)
    assert len(extra) - len(_checkpointed_variables(run_1)) == trainable + 2 + 6
    assert {id(v) for v in added} <= {id(v) for v in extra}
    assert _nbytes(created_n) - _nbytes(created_1) == _nbytes(added)
    # Without the noise scale: the accumulators alone.
    run_off, created_off = _build_counting(N, log_noise_scale=False)
    assert run_off.step.noise_scale is None
    assert len(created_off) - len(created_1) == trainable + 2


@dataclasses.dataclass
class Trained:
    shapes: int  # distinct micro-batch shapes fed
    created: list  # names of variables created while stepping
    before: int  # live tensor bytes after the first window
    after: list  # live tensor bytes after each later micro-step
    update_step: int
    tracing_counts: list  # of accumulate, accumulate_and_update
    exact: bool  # the allocator counts tensor bytes exactly (see _measure_in_child)
    accumulator_bytes: int


def _train_and_measure():
    """WINDOWS + 1 windows of micro-batches of different shapes, on a run whose
    weight matrices are big enough (hidden 128, filter 512) for TF to treat them as
    it treats real ones; every micro-step under a variable creator scope, live bytes
    read after each micro-step from the second window on (the first traces)."""
    batches = _tensors(uneven_micro_batches(N * (WINDOWS + 1)))
    run = _build(N, hidden_size=128, filter_size=512)
    created, after = [], []

    def creator(next_creator, **kwargs):
        created.append(kwargs.get("name"))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        for i, batch in enumerate(batches):
            run.step.train_on(batch, run.step.is_update_micro_step(i))
            if i == N - 1:
                before = _live_bytes()
            elif i >= N:
                after.append(_live_bytes())
    step = run.step
    return Trained(
        len({tuple(b["inputs"].shape) for b in batches}),
        created,
        before,
        after,
        step.update_step,
        [
            step.accumulate.experimental_get_tracing_count(),
            step.accumulate_and_update.experimental_get_tracing_count(),
        ],
        _BFC not in os.environ,
        _nbytes(step.accumulator.variables),
    )


_BFC = "TF_CPU_ALLOCATOR_USE_BFC"


def _measure_in_child():
    """Prints _train_and_measure's JSON. TF's default CPU allocator keeps statistics
    only where oneDNN is on (Intel CPUs with AVX-512: its allocator counts tensor
    bytes exactly); elsewhere (seen on an AMD EPYC) it has none, and this re-runs
    itself with the BFC allocator, which counts the chunks holding tensors: a
    buffer a variable adopts on assign may sit in a chunk up to twice its size, so
    its counts move by a few hundred KB at updates while the tensors do not."""
    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:
        if _BFC in os.environ:
            raise
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, _BFC: "true"}
        )
    print(json.dumps(dataclasses.asdict(_train_and_measure())))


def _child_allocator():
    """The environment _measure_in_child would re-run itself with, decided in this
    process (the same TensorFlow on the same CPU), so the child starts TF once."""
    try:
        tf.config.experimental.get_memory_info("CPU:0")
        return {}
    except ValueError:
        return {_BFC: "true"}


@pytest.fixture(scope="module")
def trained():
    """_train_and_measure in a process of its own: live-byte counts are exact only when
    no earlier test's tensors are freed while they are read."""
    result = forked.run(
        [sys.executable, __file__, "measure"],
        capture_output=True,
        text=True,
        check=False,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        env={**os.environ, **_child_allocator()},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return Trained(**json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_micro_steps_create_no_variables_and_trace_once(trained):
    """No variable is created after build_training, and each compiled function is traced
    once for micro-batches of every shape."""
    assert trained.shapes == N * (WINDOWS + 1)
    assert trained.created == []
    assert trained.update_step == WINDOWS + 1
    assert trained.tracing_counts == [1, 1]


@pytest.mark.slow
def test_micro_steps_allocate_nothing_that_stays(trained):
    """Accumulating adds in place: after every accumulate-only micro-step of a window
    (but the first) the live tensor bytes are the same (with either allocator), and
    every update leaves the same amount (to BFC's chunk rounding, see
    _measure_in_child: less than half of one model copy)."""
    after = trained.after
    for window in range(WINDOWS):
        live = after[window * N : (window + 1) * N]
        assert len(set(live[1 : N - 1])) == 1, live  # no growth inside a window
    updates = after[N - 1 :: N]
    assert max(updates) - min(updates) <= _slack(trained), updates


def _slack(trained):
    """How far apart two exact-same live-tensor states may count: 0 with an exact
    allocator, under half a model copy with BFC (the bug below added a whole one)."""
    return 0 if trained.exact else trained.accumulator_bytes // 2


@pytest.mark.slow
def test_live_bytes_are_the_same_after_every_micro_step(trained):
    """The accumulators, allocated once at build, are the only extra, so nothing
    changes from one micro-step to the next, update or not. (Resetting them with
    assign(zeros_like) failed this: they aliased folded constant zeros, +1 MiB here.)"""
    drift = [a - trained.before for a in trained.after]
    assert all(abs(d) <= _slack(trained) for d in drift), drift


def test_reset_zeroes_sums_that_overflowed():
    """reset() must give exact zeros even where a skipped (overflowed) window left
    Inf or NaN in the sums: 0 * Inf is NaN, so a plain multiply would poison the
    next window."""
    from t2t_lite.optim.accumulator import GradientAccumulator

    variables = [tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([4]))]
    accumulator = GradientAccumulator(variables)
    bad = [tf.constant([[np.inf, -np.inf], [np.nan, 1.0], [2.0, 3.0]]), tf.ones([4])]
    accumulator.add(bad, tf.constant(5.0), tf.constant(7.0))
    assert not np.isfinite(accumulator.gradients[0].numpy()).all()
    tf.function(accumulator.reset)()
    for sum_ in accumulator.gradients + [accumulator.loss_sum, accumulator.tokens]:
        np.testing.assert_array_equal(sum_.numpy(), np.zeros(sum_.shape))


if __name__ == "__main__":
    _measure_in_child()
