"""The time-optimal batch plan (optim/time_optimal_batch.py): its target
√(noise scale × update cost), the update cost measured from micro-step timings (the
tracing calls left out, the averages checkpointed), the limits it shares with the
adaptive plan, runs of several workers, bad specs, and a trainer run that decides
from its own timings. Its decisions across a resume are tested with the adaptive
plan's in test_batch_schedule.py."""

import math

import pytest
import tensorflow as tf
from support.cli_helpers import run_cli, tiny_trainer_flags

import t2t_lite  # noqa: F401  (registers everything)
from t2t_lite.optim.batch_plan import BatchPlanError, parse_batch_size_schedule
from t2t_lite.optim.time_optimal_batch import (
    MEASURED_OBSERVATIONS,
    TRACING_OBSERVATIONS,
)


def _plan(text, batch_size=100):
    plan = parse_batch_size_schedule(text, batch_size=batch_size)
    plan.create_state()
    return plan


def test_the_target_is_the_root_of_noise_scale_times_cost_within_the_limits():
    plan = _plan("time_optimal:200,3200,10,100")
    assert plan.cost_tokens() == 100.0
    assert plan.decide(10, 900.0) == (200, 300)  # √(900 × 100)
    assert plan.size(10) == 3
    assert plan.decide(20, 400.0) == (300, 300)  # √ = 200 would shrink it: stays
    assert plan.decide(30, 1e6) == (300, 600)  # √ = 10000: at most twice
    assert plan.decide(35, 1e6) is None  # not a decision update
    for update in (40, 50, 60):
        plan.decide(update, 1e6)
    assert plan.target == 3200  # MAX
    assert "update cost ≈ 100 tokens (given)" == plan.decision_facts()
    assert "√(noise scale × update cost, 100 tokens)" in plan.describe()


def test_a_cost_of_zero_never_grows_the_batch():
    plan = _plan("time_optimal:200,3200,10,0")
    assert plan.decide(10, 1e9) == (200, 200)


def _observe(plan, count, accumulate_seconds, update_seconds, tokens=1000):
    """`count` windows of two micro-steps: one accumulating, one updating."""
    for _ in range(count):
        plan.observe(accumulate_seconds, tokens, closes_window=False)
        plan.observe(update_seconds, tokens, closes_window=True)


def test_the_update_cost_is_measured_from_timings_without_the_tracing_calls():
    plan = _plan("time_optimal:200,3200,10")
    assert plan.describe().endswith(
        "update cost, measured) every 10 updates, at most 3200)"
    )
    _observe(plan, TRACING_OBSERVATIONS, 100.0, 300.0)  # tracing: left out
    _observe(plan, MEASURED_OBSERVATIONS - 1, 1.0, 1.05)
    assert plan.cost_tokens() is None  # too few timings yet
    assert plan.decide(10, 1e6) == (200, 200)  # nothing to decide from: stays
    assert plan.decision_facts() == "update cost not measured yet"
    _observe(plan, 1, 1.0, 1.05)
    # t = 1 s / 1000 tokens; the update's 1.05 s is 1000 tokens and 50 tokens' worth.
    assert plan.cost_tokens() == pytest.approx(50.0, rel=1e-9)
    assert plan.decide(20, 1800.0) == (200, 300)  # √(1800 × 50)
    # An update that costs less than its tokens (timing noise) costs nothing:
    _observe(plan, 500, 1.0, 0.9)
    assert plan.cost_tokens() == 0.0


def test_the_measured_cost_is_in_the_checkpoint(tmp_path):
    plan = _plan("time_optimal:200,3200,10")
    _observe(plan, TRACING_OBSERVATIONS + MEASURED_OBSERVATIONS, 2.0, 2.5, tokens=500)
    path = tf.train.Checkpoint(plan=plan.state).save(str(tmp_path / "ckpt"))
    restored = _plan("time_optimal:200,3200,10")
    tf.train.Checkpoint(plan=restored.state).restore(path).assert_consumed()
    assert restored.cost_tokens() == pytest.approx(plan.cost_tokens(), rel=1e-12)
    assert math.isclose(plan.cost_tokens(), 125.0)  # 0.5 s at 4 ms a token


def test_several_workers_must_give_the_cost():
    measured = _plan("time_optimal:200,3200,10")
    measured.check_workers(1)
    with pytest.raises(BatchPlanError) as error:
        measured.check_workers(2)
    message = str(error.value)
    assert "\n" not in message and "2 workers" in message and "COST" in message
    _plan("time_optimal:200,3200,10,50").check_workers(2)


def test_time_optimal_alone_runs_from_two_micro_batches_to_64_measuring_the_cost():
    plan = parse_batch_size_schedule("time_optimal", batch_size=100, replicas=2)
    assert (plan.minimum, plan.maximum, plan.every) == (400, 12800, 100)
    assert plan.given_cost is None


@pytest.mark.parametrize(
    "schedule, words",
    [
        ("time_optimal:200,3200,10,-1", ["COST must be a number of tokens >= 0"]),
        ("time_optimal:200,3200,10,inf", ["COST must be a number of tokens >= 0"]),
        ("time_optimal:200,3200,10,cheap", ["time_optimal takes MIN,MAX"]),
        ("time_optimal:200", ["time_optimal takes MIN,MAX"]),
        ("time_optimal:400,200", ["MIN 400 is larger than MAX 200"]),
        ("time_optimal:100,3200", ["two micro-batches"]),
    ],
)
def test_bad_time_optimal_specs_are_one_line_errors(schedule, words):
    with pytest.raises(BatchPlanError) as error:
        parse_batch_size_schedule(schedule, batch_size=100)
    message = str(error.value)
    assert "\n" not in message and f"'{schedule}'" in message
    for word in words:
        assert word in message


def test_a_trainer_run_decides_from_its_own_timings(tmp_path):
    """The loop reports each micro-step's time to the plan: by the first decision
    (update 15, 30 micro-steps, 12 of each kind past the tracing calls) the cost
    is measured and the decision line says so."""
    result = run_cli(
        "trainer",
        *tiny_trainer_flags("algorithmic_reverse"),
        "--hparams=batch_size=128,batch_size_schedule=time_optimal:256,4096,15,"
        "learning_rate_schedule=constant*linear_warmup*rsqrt_decay",
        f"--output_dir={tmp_path / 'run'}",
        "--train_steps=32",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    decisions = [
        line
        for line in result.stderr.splitlines()
        if "Adaptive batch at update" in line
    ]
    assert len(decisions) == 1, result.stderr[-2000:]
    assert "tokens (measured); tokens per update 256 ->" in decisions[0]
    # The window that holds the target, in micro-batches of 128 tokens:
    target = int(decisions[0].split(" -> ")[1].split()[0])
    assert decisions[0].endswith(f" ({-(-target // 128)} micro-batches).")
