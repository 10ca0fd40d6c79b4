"""Batch-size schedules, the gradient noise scale and the adaptive batch
(docs/design.md §2.7, §2.8): the plans' window sizes and update counts, exact
equivalence with a hand-written reference for windows of varying size, resuming
inside a window at a ramp boundary, the noise scale on a problem with a known answer,
adaptive decisions across a resume, and bad schedules."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.accumulation_helpers import VOCAB, tiny_hparams, uneven_micro_batches
from support.cli_helpers import assert_user_error, run_cli, run_json_script
from support.window_reference import (
    MICRO,
    RAMP,
    WINDOWS,
    Reference,
    drive,
    hparams,
    ramp_micro_batches,
    ratio,
    split_into_windows,
    start_weights,
)

import t2t_lite  # noqa: F401  (registers everything)
from t2t_lite import hparams_checks
from t2t_lite.hparams import HParamsError
from t2t_lite.optim.batch_plan import (
    BatchPlan,
    BatchPlanError,
    integers,
    largest_micro_batch,
    parse_batch_size_schedule,
    plan_from_hparams,
    register_batch_plan,
)
from t2t_lite.registry import MODELS
from t2t_lite.training.opening.build import build_training

# --- plans ------------------------------------------------------------------------


def _count_updates(plan, train_steps):
    """Whole windows in train_steps micro-steps, plus the unfinished fraction,
    by walking the windows one by one."""
    steps = updates = 0
    while steps + plan.size(updates) <= train_steps:
        steps += plan.size(updates)
        updates += 1
    return updates + (train_steps - steps) / plan.size(updates)


def test_linear_ramp_sizes_and_update_count():
    plan = parse_batch_size_schedule("linear:100,400,3", batch_size=50, replicas=2)
    # target 100, 200, 300, 400, 400 tokens over micro-steps of 50 × 2 replicas:
    assert [plan.size(u) for u in range(6)] == [1, 2, 3, 4, 4, 4]
    for train_steps in (1, 3, 6, 10, 11, 37):
        assert plan.train_updates(train_steps) == pytest.approx(
            _count_updates(plan, train_steps)
        )
    assert plan.train_updates(10) == 4.0  # 1 + 2 + 3 + 4 micro-steps


def test_steps_schedule_rounds_up_to_whole_micro_batches():
    plan = parse_batch_size_schedule("steps:0=100,2=250,5=1000", batch_size=100)
    assert [plan.size(u) for u in range(7)] == [1, 1, 3, 3, 3, 10, 10]
    assert plan.tokens(2) == 300
    for train_steps in (2, 5, 11, 12, 40):
        assert plan.train_updates(train_steps) == pytest.approx(
            _count_updates(plan, train_steps)
        )


def test_a_fixed_n_and_effective_batch_size_are_the_constant_plan():
    fixed = plan_from_hparams(tiny_hparams(optimizer_multistep_accumulate_steps=3))
    assert fixed.constant and fixed.size(0) == fixed.size(10**6) == 3
    assert fixed.train_updates(10) == pytest.approx(10 / 3)  # as before windows
    effective = plan_from_hparams(tiny_hparams(effective_batch_size=900), replicas=2)
    assert effective.n == -(-900 // (tiny_hparams().batch_size * 2))


@pytest.mark.parametrize(
    "schedule, words",
    [
        ("linear:100,200", ["linear takes START,END,UPDATES"]),
        ("linear:100,200,0", ["must last >= 1 update"]),
        ("steps:5=100", ["start at 0 and increase"]),
        ("steps:0=100,0=200", ["start at 0 and increase"]),
        ("steps:0:100", ["UPDATE=TOKENS"]),
        ("linear:a,b,c", ["must be integers"]),
        ("ramp:1,2,3", ["unknown kind 'ramp'"]),
        ("8192", ["expected KIND:ARGS", "linear:START,END,UPDATES"]),
        ("adaptive:400,200", ["MIN 400 is larger than MAX 200"]),
        ("adaptive:100,200,0", ["EVERY must be >= 1"]),
        ("adaptive:100,200,5,0", ["FRACTION must be a positive number, got 0"]),
        ("adaptive:100,200,5,nan", ["FRACTION must be a positive number"]),
        ("adaptive:100,200,5,half", ["adaptive takes MIN,MAX[,EVERY[,FRACTION]]"]),
        ("adaptive:100,200,5,0.5,1", ["adaptive takes MIN,MAX[,EVERY[,FRACTION]]"]),
        ("linear:50,400,10", ["50 tokens per update", "less than one micro-batch"]),
        ("steps:0=100,3=20", ["20 tokens per update"]),
    ],
)
def test_bad_schedules_are_one_line_errors(schedule, words):
    with pytest.raises(BatchPlanError) as error:
        parse_batch_size_schedule(schedule, batch_size=100)
    message = str(error.value)
    assert "\n" not in message and f"'{schedule}'" in message
    for word in words:
        assert word in message


def test_bad_schedules_are_refused_with_the_hparams():
    with pytest.raises(HParamsError, match="both set the accumulation steps"):
        hparams_checks.validate(
            tiny_hparams(
                batch_size_schedule=RAMP, optimizer_multistep_accumulate_steps=2
            )
        )
    with pytest.raises(HParamsError, match="linear_decay"):
        hparams_checks.validate(
            hparams("sgd", schedule=f"adaptive:{2 * MICRO},{8 * MICRO}")
        )
    with pytest.raises(HParamsError, match="needs log_noise_scale"):
        hparams_checks.validate(
            tiny_hparams(
                batch_size=MICRO,
                batch_size_schedule=f"adaptive:{2 * MICRO},{8 * MICRO}",
                log_noise_scale=False,
            )
        )
    with pytest.raises(BatchPlanError, match="less than one micro-batch"):
        hparams_checks.validate(tiny_hparams(batch_size=200, batch_size_schedule=RAMP))


@pytest.mark.parametrize(
    "schedule, fragment",
    [
        ("linear:1024,2048", "linear takes START,END,UPDATES"),
        ("adaptive:2048,1024", "MIN 2048 is larger than MAX 1024"),
        ("steps:0=100", "less than one micro-batch"),
    ],
)
def test_t2t_trainer_refuses_a_bad_schedule_before_writing(
    tmp_path, schedule, fragment
):
    out = tmp_path / "run"
    result = run_cli(
        "trainer",
        "--problem=algorithmic_reverse",
        "--hparams_set=transformer_test",
        f"--hparams=batch_size_schedule={schedule}",
        f"--output_dir={out}",
        "--train_steps=2",
    )
    assert_user_error(result, "t2t-trainer", "batch_size_schedule", fragment)
    assert not out.exists()


# --- exactness --------------------------------------------------------------------


def _micro_batches():
    return ramp_micro_batches(seed=3)


def _run(optimizer):
    return build_training(
        hparams(optimizer),
        vocab_size=VOCAB,
        train_steps=sum(WINDOWS),
        initial_weights=list(start_weights()),
    )


@functools.cache
def _whole(optimizer):
    """(run, window sizes met) after all of WINDOWS, uninterrupted."""
    run = _run(optimizer)
    return run, drive(run.step, _micro_batches())


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_a_ramp_equals_big_batches_of_its_windows(optimizer):
    run, sizes = _whole(optimizer)
    micro = _micro_batches()
    assert sizes == WINDOWS
    assert run.step.update_step == len(WINDOWS) and run.step.micro_step == len(micro)
    reference = Reference(hparams(optimizer))
    numpy_micro = uneven_micro_batches(sum(WINDOWS), seed=3)
    weights, velocity = reference(
        list(start_weights()),
        split_into_windows(numpy_micro, WINDOWS),
        optimizer,
        total_updates=len(WINDOWS),
    )
    assert ratio([v.numpy() for v in run.model.trainable_variables], weights) < 1
    if optimizer == "momentum":
        slots = [tf.convert_to_tensor(s).numpy() for s in run.optimizer.momentums]
        assert ratio(slots, velocity) < 1
    # linear_decay ends exactly at the last update: the rate the run would use next
    # is 0 and the last one it used is not.
    assert float(run.schedule(len(WINDOWS))) == 0.0
    assert float(run.schedule(len(WINDOWS) - 1)) > 0.0


def test_a_run_stopped_inside_a_window_at_a_ramp_boundary_resumes_exactly(tmp_path):
    micro = _micro_batches()
    whole, _ = _whole("momentum")
    first = _run("momentum")
    # 3 micro-steps: windows 1 and 1, then the first micro-batch of the first
    # window of 2 (where the ramp steps up).
    assert drive(first.step, micro, stop_after=3) == [1, 1, 2]
    assert first.step.window() == (2, 1)
    path = first.checkpoint().save(str(tmp_path / "ckpt"))
    resumed = _run("momentum")
    resumed.checkpoint().restore(path).assert_consumed()
    assert resumed.step.window() == (2, 1) and resumed.step.micro_step == 3
    assert drive(resumed.step, micro[3:]) == [2, 2, 4, 4]
    assert (
        ratio(
            [v.numpy() for v in resumed.model.trainable_variables],
            [v.numpy() for v in whole.model.trainable_variables],
            rtol=1e-6,
        )
        < 1
    )
    assert resumed.step.update_step == whole.step.update_step == len(WINDOWS)
    assert int(resumed.step.tokens_seen) == int(whole.step.tokens_seen) > 0


@pytest.fixture(scope="module")
def two_replicas():
    return run_json_script("batch_schedule_replicas.py")


def test_a_ramp_on_two_replicas_equals_big_batches_of_its_windows(two_replicas):
    report = two_replicas
    assert report["sizes"] == WINDOWS and report["updates"] == len(WINDOWS)
    assert report["weights_ratio"] < 1
    assert len(report["slots_ratios"]) == 1 and report["slots_ratios"][0] < 1
    assert report["noise_scale"] is not None and report["noise_scale"] > 0


def test_adam_at_a_half_life_in_tokens_on_two_replicas_equals_adam_by_hand(
    two_replicas,
):
    """Both betas follow the windows' tokens over both replicas; the update builds
    them once on each replica's device (4 powers each), not once per variable."""
    adam = two_replicas["adam"]
    assert adam["sizes"] == WINDOWS and adam["updates"] == len(WINDOWS)
    assert adam["weights_ratio"] < 1
    assert len(adam["slots_ratios"]) == 2 and max(adam["slots_ratios"]) < 1  # m, v
    assert adam["update_pow_ops"] == 4 * 2 < adam["variables"]


# --- the noise scale --------------------------------------------------------------

TARGET_IDS = np.array([0, 8, 4, 2, 1, 1, 1, 1], float) / 18  # ids 1..7; 0 is padding


class LogitBias(keras.Model):
    """Logits that are one learned vector, whatever the input: a token's gradient
    is softmax(b) − onehot(target), so with targets drawn from p and b = 0 the
    truth is known, |G|² = |uniform − p|² and tr(Σ) = 1 − Σ p²."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.logit_bias = self.add_weight(
            shape=(vocab_size,), initializer="zeros", name="logit_bias"
        )

    @classmethod
    def from_hparams(cls, hp, vocab_size):
        del hp
        return cls(vocab_size)

    def call(self, features, training=False):
        targets = features["targets"]
        shape = tf.concat([tf.shape(targets), [self.vocab_size]], 0)
        return tf.broadcast_to(self.logit_bias, shape)


MODELS.add("logit_bias", LogitBias)


def _sampled_batches(rng, count, p):
    """Micro-batches of 1-3 rows of 2-8 targets drawn from p, each row cut at a
    random length (0-padded): token counts differ from one micro-batch to the next."""
    out = []
    for _ in range(count):
        rows, length = rng.integers(1, 4), rng.integers(2, 9)
        targets = rng.choice(len(p), size=(rows, length), p=p).astype(np.int32)
        for row in range(rows):
            targets[row, rng.integers(1, length + 1) :] = 0
        out.append(
            {"inputs": tf.ones([rows, 2], tf.int32), "targets": tf.constant(targets)}
        )
    return out


def _noise_scale_run(p, updates, schedule="", n=4, rate=0.0, **overrides):
    """A run of LogitBias on len(p) ids; rate 0: the truth does not move."""
    hp = tiny_hparams(
        **overrides,
        optimizer="sgd",
        batch_size=8,
        optimizer_multistep_accumulate_steps=1 if schedule else n,
        batch_size_schedule=schedule,
        learning_rate_schedule="constant",
        learning_rate_constant=rate,
        label_smoothing=0.0,
        noise_scale_decay=0.995,
    )
    hparams_checks.validate(hp, model=None)
    return build_training(
        hp, vocab_size=len(p), train_steps=updates * n, model="logit_bias"
    )


def test_a_step_whose_windows_vary_has_no_update_micro_step_by_number():
    """Only a fixed n tells an update from a step number; with a schedule the
    window sizes come from windows(), and asking is a clear TypeError."""
    run = _noise_scale_run(TARGET_IDS, updates=2, schedule="linear:16,32,2")
    with pytest.raises(TypeError, match=r"windows vary: drive them with windows\(\)"):
        run.step.is_update_micro_step(0)


def test_the_noise_scale_estimate_is_within_15_percent_of_the_truth():
    uniform = np.full(len(TARGET_IDS), 1 / len(TARGET_IDS))
    truth = (1 - np.sum(TARGET_IDS**2)) / np.sum((uniform - TARGET_IDS) ** 2)
    run = _noise_scale_run(TARGET_IDS, updates=800)
    batches = _sampled_batches(np.random.default_rng(0), 800 * 4, TARGET_IDS)
    for i, batch in enumerate(batches):
        out = run.step.train_on(batch, run.step.is_update_micro_step(i))
    estimate = run.step.noise_scale_value()
    assert float(out["noise_scale"][0]) == pytest.approx(estimate)
    assert abs(estimate / truth - 1) < 0.15, (estimate, truth)


def test_without_noise_the_noise_scale_is_near_zero():
    certain = np.zeros(len(TARGET_IDS))
    certain[3] = 1.0
    run = _noise_scale_run(certain, updates=50)
    for i, batch in enumerate(_sampled_batches(np.random.default_rng(1), 200, certain)):
        run.step.train_on(batch, run.step.is_update_micro_step(i))
    uniform = np.full(len(TARGET_IDS), 1 / len(TARGET_IDS))
    gradient_square = np.sum((uniform - certain) ** 2)
    assert float(run.step.noise_scale.gradient_average) > 0
    # B_simple = tr(Σ) / |G|² with tr(Σ) = 0: float error only.
    assert abs(float(run.step.noise_scale.value())) < 1e-4 / gradient_square


def test_the_noise_scale_is_not_measured_without_two_micro_batches():
    run = _noise_scale_run(TARGET_IDS, updates=4, n=1)
    assert run.step.noise_scale is None and run.step.noise_scale_value() is None


# --- the adaptive batch -----------------------------------------------------------

# Targets uniform over ids 1..7 (logits uniform over 8): B_simple ≈ 48 tokens.
FLAT = np.array([0.0] + [1 / 7] * 7)
ADAPTIVE = "adaptive:16,128,5"  # 2 micro-batches of 8 tokens to 16, deciding every 5


def _drive_adaptive(run, batches, stop_after=None):
    """Feeds batches window by window; returns the decisions (update, old, new)."""
    decisions = []
    drive(run.step, batches, stop_after, on_decision=lambda *d: decisions.append(d))
    return decisions


# √(48 × 100) ≈ 69 tokens: a time-optimal plan whose update costs 100 tokens grows
# too (its cost given, so that decisions do not read this machine's timings).
TIME_OPTIMAL = "time_optimal:16,128,5,100"


@pytest.mark.parametrize(
    "schedule, rate_rule",
    [
        (ADAPTIVE, {}),
        (
            ADAPTIVE,
            {
                "learning_rate_batch_scaling": "sqrt",
                "learning_rate_schedule_unit": "tokens",
            },
        ),
        (
            TIME_OPTIMAL,
            {
                "learning_rate_batch_scaling": "sqrt",
                "learning_rate_schedule_unit": "tokens",
            },
        ),
    ],
)
def test_adaptive_decisions_respect_bounds_and_repeat_after_a_resume(
    tmp_path, schedule, rate_rule
):
    """With and without a rate that follows the batch (it reads the window's
    planned tokens, which the decisions change, and the tokens trained on)."""
    batches = _sampled_batches(np.random.default_rng(2), 200, FLAT)
    run = functools.partial(
        _noise_scale_run, FLAT, 100, schedule=schedule, rate=0.05, **rate_rule
    )
    whole = run()
    decisions = _drive_adaptive(whole, batches)
    assert [d[0] for d in decisions] == [5 * k for k in range(1, len(decisions) + 1)]
    assert len(decisions) >= 3
    for _, old, new in decisions:
        assert 16 <= old <= new <= min(2 * old, 128)  # never shrinks, at most doubles
    assert decisions[-1][2] > 16  # the measured scale (≈ 48 tokens) grew the batch
    # Stopped inside a window after the second decision, saved, resumed:
    first = run()
    cut = 47
    before = _drive_adaptive(first, batches, stop_after=cut)
    path = first.checkpoint().save(str(tmp_path / "ckpt"))
    resumed = run()
    resumed.checkpoint().restore(path).assert_consumed()
    after = _drive_adaptive(resumed, batches[cut:])
    assert before and after and before + after == decisions
    assert resumed.step.plan.target == whole.step.plan.target
    clocks = [run.step.clock for run in (resumed, whole)]
    assert int(clocks[0].tokens_trained) == int(clocks[1].tokens_trained) > 0
    assert float(clocks[0].applied_rate) == float(clocks[1].applied_rate) > 0
    assert (
        ratio(
            [v.numpy() for v in resumed.model.trainable_variables],
            [v.numpy() for v in whole.model.trainable_variables],
            rtol=1e-6,
        )
        < 1
    )


def test_an_adaptive_fraction_aims_below_the_noise_scale():
    half = parse_batch_size_schedule("adaptive:200,3200,10,0.5", batch_size=100)
    full = parse_batch_size_schedule("adaptive:200,3200,10", batch_size=100)
    half.create_state(), full.create_state()
    assert half.decide(10, 600.0) == (200, 300)  # 0.5 × 600
    assert full.decide(10, 600.0) == (200, 400)  # 600, at most twice the target
    assert half.size(10) == 3 and full.size(10) == 4
    assert half.decide(20, 500.0) == (300, 300)  # 250 would shrink it: it stays
    assert "toward 0.5 × the noise scale" in half.describe()
    assert "toward the noise scale" in full.describe()


def test_an_adaptive_minimum_must_allow_two_micro_batches():
    with pytest.raises(BatchPlanError, match="two micro-batches"):
        parse_batch_size_schedule("adaptive:8,64", batch_size=8)


def test_a_checkpoint_from_before_windows_resumes_inside_its_window(tmp_path):
    """A checkpoint without window_size/window_position/tokens_seen/noise_scale
    (an older version's), saved at micro-step 7 of n=3: it restores, and the window
    is taken as global_step mod n (position 1 of 3), so the run finishes it."""
    from t2t_lite.outputs.checkpoints import CheckpointKeeper
    from t2t_lite.training.step.train_step import OPTIONAL_CHECKPOINT_ITEMS

    hp = tiny_hparams(optimizer_multistep_accumulate_steps=3)
    old = build_training(hp, vocab_size=VOCAB, train_steps=9)
    old.step.global_step.assign(7)
    items = dict(old.step.checkpoint_items())
    for name in ("window_size", "window_position", "tokens_seen", "noise_scale"):
        del items[name]
    written = tf.train.Checkpoint(**items, train_replicas=old.replicas_variable)
    tf.train.CheckpointManager(
        written, str(tmp_path), max_to_keep=1, checkpoint_name="model"
    ).save(checkpoint_number=7)
    new = build_training(hp, vocab_size=VOCAB, train_steps=9)
    keeper = CheckpointKeeper(
        new.checkpoint(),
        str(tmp_path),
        5,
        new.model.trainable_variables,
        optional=OPTIONAL_CHECKPOINT_ITEMS,
    )
    assert keeper.restore_newest_readable() == str(tmp_path / "model-7")
    assert new.step.window() == (3, 1)
    sizes = drive(new.step, _micro_batches()[:5])  # 2 to end the window, then 3
    assert sizes == [3, 3] and new.step.update_step == 2 and new.step.window() == (3, 0)


# --- a batch plan of one's own (docs/extending.md) ---------------------------------


class Doubling(BatchPlan):
    """START tokens per update, doubled every EVERY updates."""

    def __init__(self, text, start, every, micro_batch_tokens):
        super().__init__(text, micro_batch_tokens)
        self.start, self.every = start, every

    def size(self, update):
        tokens = self.start * 2 ** (update // self.every)
        return max(1, -(-tokens // self.micro_batch_tokens))

    def smallest_tokens(self):
        return self.start


@register_batch_plan("doubling")
def _doubling(body, text, micro_batch_tokens):
    start, every = integers(body, "START,EVERY", text)
    return Doubling(text, start, every, micro_batch_tokens)


def test_a_registered_batch_plan_is_a_batch_size_schedule_kind():
    hp = tiny_hparams(batch_size=MICRO, batch_size_schedule=f"doubling:{MICRO},2")
    hparams_checks.validate(hp)
    plan = plan_from_hparams(hp)
    assert [plan.size(u) for u in range(6)] == [1, 1, 2, 2, 4, 4]
    assert (
        plan.train_updates(14) == 6.0 and plan.train_updates(16) == 6.25
    )  # 2 of window 6 (8)
    run = build_training(hp, vocab_size=VOCAB, train_steps=14)
    assert drive(run.step, _micro_batches()) == WINDOWS
    assert run.step.update_step == len(WINDOWS)
    with pytest.raises(BatchPlanError, match="START,EVERY must be integers"):
        plan_from_hparams(hp.copy().override(batch_size_schedule="doubling:a,b"))
    with pytest.raises(BatchPlanError, match="less than one micro-batch"):
        plan_from_hparams(hp.copy().override(batch_size_schedule="doubling:8,2"))
    with pytest.raises(BatchPlanError, match=r"unknown kind 'tripling'.*doubling"):
        plan_from_hparams(hp.copy().override(batch_size_schedule="tripling:8,2"))


def test_adaptive_alone_runs_from_two_micro_batches_to_64():
    plan = parse_batch_size_schedule("adaptive", batch_size=100, replicas=2)
    assert (plan.minimum, plan.maximum, plan.every) == (400, 12800, 100)
    assert plan.size(0) == 2
    # batch_size=0 (auto): the plan follows the micro-batch, so it bounds nothing.
    auto = tiny_hparams(batch_size=0, batch_size_schedule="adaptive")
    assert largest_micro_batch(auto, replicas=1) > 10**9
    with pytest.raises(BatchPlanError, match="unknown kind 'adaptiv'"):
        parse_batch_size_schedule("adaptiv", batch_size=100)
