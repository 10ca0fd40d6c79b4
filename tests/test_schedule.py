"""Tests for t2t_lite.optim.schedule: each factor against hand-computed values, the
schedule parser's errors, and the accumulation contract (docs/design.md §2): the learning
rate is evaluated in updates, and train_steps is divided by n before any factor."""

import math

import numpy as np
import pytest
from support.accumulation_helpers import build, run, tiny_hparams, uneven_micro_batches

import t2t_lite  # noqa: F401  (registers everything)
from t2t_lite.errors import UserError
from t2t_lite.hparams import HParamsError
from t2t_lite.optim.batch_plan import (
    BatchPlanError,
    accumulate_steps,
    plan_from_hparams,
)
from t2t_lite.optim.schedule import (
    FACTORS,
    LearningRateSchedule,
    ScheduleError,
    parse_schedule,
    schedule_from_hparams,
)
from t2t_lite.registry import HPARAMS_SETS


def _hp(**overrides):
    return HPARAMS_SETS.get("transformer_base")().override(**overrides)


def _schedule(hp, train_steps, replicas=1):
    """The run's schedule of `hp`: its batch plan on `replicas` replicas."""
    return schedule_from_hparams(hp, train_steps, plan_from_hparams(hp, replicas))


def _rates(schedule, steps, train_steps=1000, **overrides):
    """The schedule string's learning rate at each step, as Python floats."""
    hp = _hp(learning_rate_schedule=schedule, **overrides)
    fn = _schedule(hp, train_steps)
    return [float(fn(step)) for step in steps]


def _close(actual, expected):
    assert actual == pytest.approx(expected, rel=1e-6, abs=1e-12)


# --- factors --------------------------------------------------------------------


def test_constant():
    _close(
        _rates("constant", [0, 7, 10**6], learning_rate_constant=2.5), [2.5, 2.5, 2.5]
    )


def test_linear_warmup():
    _close(
        _rates("linear_warmup", [0, 1, 5, 10, 25], learning_rate_warmup_steps=10),
        [0.0, 0.1, 0.5, 1.0, 1.0],
    )


def test_rsqrt_decay():
    _close(
        _rates("rsqrt_decay", [0, 50, 100, 400, 10000], learning_rate_warmup_steps=100),
        [0.1, 0.1, 0.1, 0.05, 0.01],
    )


def test_rsqrt_normalized_decay():
    _close(
        _rates(
            "rsqrt_normalized_decay",
            [0, 100, 400, 1600],
            learning_rate_warmup_steps=100,
        ),
        [1.0, 1.0, 0.5, 0.25],
    )


def test_rsqrt_hidden_size():
    _close(_rates("rsqrt_hidden_size", [0, 123], hidden_size=64), [0.125, 0.125])
    _close(_rates("rsqrt_hidden_size", [5]), [512**-0.5])


def test_linear_decay():
    # train_steps 100, decay over the last 20: 1 until step 80, then down to 0.
    _close(
        _rates(
            "linear_decay",
            [0, 80, 90, 95, 100, 120],
            train_steps=100,
            learning_rate_decay_steps=20,
        ),
        [1.0, 1.0, 0.5, 0.25, 0.0, 0.0],
    )


def test_cosdecay():
    # 1 up to and including warmup, then 0.5 * (1 + cos(pi * step / decay_steps)).
    _close(
        _rates(
            "cosdecay",
            [0, 10, 25, 50, 100],
            learning_rate_warmup_steps=10,
            learning_rate_decay_steps=100,
        ),
        [1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.0],
    )


def test_exp_decay():
    # 0.5 ** ((step - warmup) / decay_steps), p clamped at 0 during warmup.
    common = {
        "learning_rate_warmup_steps": 10,
        "learning_rate_decay_steps": 20,
        "learning_rate_decay_rate": 0.5,
    }
    _close(
        _rates("exp_decay", [0, 10, 30, 40, 50], **common),
        [1.0, 1.0, 0.5, 0.5**1.5, 0.25],
    )


def test_exp_decay_staircase():
    common = {
        "learning_rate_warmup_steps": 10,
        "learning_rate_decay_steps": 20,
        "learning_rate_decay_rate": 0.5,
        "learning_rate_decay_staircase": True,
    }
    _close(
        _rates("exp_decay", [0, 29, 30, 40, 49, 50], **common),
        [1.0, 1.0, 0.5, 0.5, 0.5, 0.25],
    )


def test_factors_multiply_and_whitespace_is_tolerated():
    _close(
        _rates(
            " constant * linear_warmup ",
            [5, 20],
            learning_rate_constant=3.0,
            learning_rate_warmup_steps=10,
        ),
        [1.5, 3.0],
    )


def test_all_documented_factors_exist():
    assert set(FACTORS) == {
        "constant",
        "linear_warmup",
        "rsqrt_decay",
        "rsqrt_normalized_decay",
        "rsqrt_hidden_size",
        "linear_decay",
        "cosdecay",
        "exp_decay",
    }


def test_transformer_base_schedule():
    hp = HPARAMS_SETS.get("transformer_base")()
    fn = _schedule(hp, 250000)
    _close(float(fn(8000)), 2.0 * 8000**-0.5 * 512**-0.5)
    _close(float(fn(4000)), 2.0 * 0.5 * 8000**-0.5 * 512**-0.5)
    _close(float(fn(32000)), 2.0 * 32000**-0.5 * 512**-0.5)


def test_schedule_accepts_integer_tensors_and_python_ints():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    fn = _schedule(
        _hp(learning_rate_schedule="linear_warmup", learning_rate_warmup_steps=10), 100
    )
    for step in (4, tf.constant(4, tf.int64), tf.Variable(4, dtype=tf.int64)):
        _close(float(fn(step)), 0.4)


# --- parse errors -----------------------------------------------------------------


def test_unknown_factor_is_a_schedule_error_naming_it_and_listing_known():
    with pytest.raises(ScheduleError) as info:
        parse_schedule("constant*linear_warmpu")
    error = info.value
    assert isinstance(error, UserError)
    message = str(error)
    assert "'linear_warmpu'" in message and "\n" not in message
    for name in FACTORS:
        assert name in message


def test_unknown_factor_fails_when_the_schedule_is_built():
    with pytest.raises(ScheduleError, match="'warmup'"):
        _schedule(_hp(learning_rate_schedule="constant*warmup"), 100)


@pytest.mark.parametrize(
    "text", ["", "   ", "constant*", "*constant", "constant**linear_warmup"]
)
def test_empty_schedule_or_empty_factor_is_an_error(text):
    with pytest.raises(ScheduleError) as info:
        parse_schedule(text)
    assert "\n" not in str(info.value) and "Known factors" in str(info.value)


def test_schedule_config_round_trip():
    fn = _schedule(_hp(), 1000)
    back = LearningRateSchedule.from_config(fn.get_config())
    _close(float(back(100)), float(fn(100)))


# --- accumulation: the schedule counts updates; train_steps is divided by n -------

T = 4 * 100  # micro-steps


def _decaying_hp(n):
    return _hp(
        learning_rate_schedule="constant*linear_warmup*linear_decay",
        learning_rate_warmup_steps=10,
        learning_rate_decay_steps=20,
        optimizer_multistep_accumulate_steps=n,
    )


def test_train_steps_is_divided_by_n():
    accumulated = _schedule(_decaying_hp(4), T)
    big_batch = _schedule(_decaying_hp(1), T // 4)
    updates = range(T // 4 + 5)  # warmup (0..10), flat, decay (80..100), after.
    rates = [float(accumulated(u)) for u in updates]
    assert rates == [float(big_batch(u)) for u in updates]
    # The range really covers warmup and the linear_decay region.
    assert rates[0] == 0.0 and rates[5] < rates[10] == 2.0
    assert 0.0 < rates[90] < 2.0 and rates[100] == 0.0


def test_undivided_train_steps_would_be_caught():
    """T2T's bug (step in updates, train_steps in micro-steps) gives other rates."""
    accumulated = _schedule(_decaying_hp(4), T)
    t2t_bug = _schedule(_decaying_hp(1), T)
    differing = [
        u for u in range(T // 4 + 1) if float(accumulated(u)) != float(t2t_bug(u))
    ]
    assert differing == list(range(81, T // 4 + 1))
    _close(float(accumulated(90)), 1.0)
    _close(float(t2t_bug(90)), 2.0)


def test_optimizer_learning_rate_counts_updates_not_micro_steps():
    hp = tiny_hparams(
        optimizer="sgd",
        optimizer_multistep_accumulate_steps=4,
        learning_rate_schedule="constant*linear_warmup",
        learning_rate_warmup_steps=10,
    )
    micro_steps = 8
    model, step = build(hp, train_steps=micro_steps)
    schedule = _schedule(hp, micro_steps)
    start = [w.copy() for w in model.get_weights()]
    batches = uneven_micro_batches(micro_steps)

    run(step, batches[:4])
    assert int(step.optimizer.iterations) == 1
    # Update 0 used schedule(0) == 0 (warmup): SGD left every weight unchanged.
    assert all(np.array_equal(a, b) for a, b in zip(start, model.get_weights()))

    run(step, batches[4:], start=4)
    assert step.micro_step == micro_steps
    assert int(step.optimizer.iterations) == 2
    # Update 1 used schedule(1) > 0: the weights moved.
    assert not all(np.array_equal(a, b) for a, b in zip(start, model.get_weights()))
    rate = float(step.optimizer.learning_rate)
    _close(rate, float(schedule(2)))
    _close(rate, 0.01 * 2 / 10)
    assert rate != pytest.approx(float(schedule(micro_steps)))


# --- accumulate_steps -------------------------------------------------------------


@pytest.mark.parametrize("n,expected", [(0, 1), (1, 1), (4, 4), (8, 8)])
def test_accumulate_steps(n, expected):
    assert accumulate_steps(_hp(optimizer_multistep_accumulate_steps=n)) == expected


@pytest.mark.parametrize("n", [-1, -4])
def test_negative_accumulate_steps_is_a_batch_plan_error(n):
    hp = _hp(optimizer_multistep_accumulate_steps=n)
    with pytest.raises(BatchPlanError) as info:
        accumulate_steps(hp)
    message = str(info.value)
    assert "optimizer_multistep_accumulate_steps" in message and str(n) in message
    assert isinstance(info.value, UserError) and "\n" not in message
    with pytest.raises(BatchPlanError):
        _schedule(hp, 100)


@pytest.mark.parametrize("text", ["2.5", "two", "true", ""])
def test_non_integer_accumulate_steps_is_an_hparams_error(text):
    hp = _hp()
    with pytest.raises(HParamsError) as info:
        hp.parse(f"optimizer_multistep_accumulate_steps={text}")
    assert "optimizer_multistep_accumulate_steps" in str(info.value)
    assert "int" in str(info.value)
    assert hp.optimizer_multistep_accumulate_steps == 1


def test_accumulate_steps_rejects_a_non_integer_value_from_json():
    from t2t_lite.hparams import HParams  # pylint: disable=g-import-not-at-top

    hp = HParams.from_json(
        '{"optimizer_multistep_accumulate_steps": 2.5, "effective_batch_size": 0}'
    )
    with pytest.raises(BatchPlanError):
        accumulate_steps(hp)


@pytest.mark.parametrize(
    "target, batch_size, replicas, expected",
    [
        (8192, 2048, 1, 4),  # exact
        (10000, 2048, 1, 5),  # rounded up: 10240 tokens per update
        (8192, 2048, 2, 2),  # replicas take their share
        (8192, 2048, 3, 2),  # ceil(8192 / 6144)
        (2048, 2048, 1, 1),  # one micro-batch: no accumulation
        (32768, 4096, 8, 1),
    ],
)
def test_effective_batch_size_derives_n(target, batch_size, replicas, expected):
    hp = _hp(effective_batch_size=target, batch_size=batch_size)
    assert accumulate_steps(hp, replicas) == expected
    # The schedule's train_steps / n uses the same n.
    schedule = _schedule(hp, 120 * expected, replicas=replicas)
    assert schedule.config.train_updates == 120


@pytest.mark.parametrize(
    "target, batch_size, replicas", [(100, 512, 1), (1000, 2048, 1), (25000, 4096, 8)]
)
def test_effective_batch_size_below_one_micro_batch_is_one_line(
    target, batch_size, replicas
):
    hp = _hp(effective_batch_size=target, batch_size=batch_size)
    with pytest.raises(BatchPlanError) as info:
        accumulate_steps(hp, replicas)
    message = str(info.value)
    assert "\n" not in message and "less than one micro-batch" in message
    assert f"effective_batch_size {target}" in message
    assert f"= {batch_size * replicas} tokens" in message
