"""The learning rate that follows the batch (docs/batch.md, optim/schedule.py):

    lr(u) = schedule(s(u)) × (tokens(u) / reference)^p

with tokens(u) the planned tokens of window u, p = 1/2 (sqrt) or 1 (linear), and s(u)
the update step (unit "updates") or the planned tokens of the updates before u
divided by the reference (unit "tokens"). Checked against a hand-written reference
(tests/support/window_reference.py) over windows of 1, 1, 2, 2, 4, 4 micro-batches.
"""

import itertools

import pytest
import tensorflow as tf
from support.accumulation_helpers import VOCAB, tiny_hparams, uneven_micro_batches
from support.cli_helpers import assert_user_error, run_cli
from support.window_reference import (
    BETA_1,
    BETA_2,
    CONSTANT,
    DECAY,
    MICRO,
    WINDOWS,
    Reference,
    hand_betas,
    hparams,
    ramp_micro_batches,
    ratio,
    split_into_windows,
    start_weights,
)

import t2t_lite  # noqa: F401  (registers everything)
from t2t_lite import hparams_checks
from t2t_lite.hparams import HParamsError
from t2t_lite.optim.batch_plan import plan_from_hparams
from t2t_lite.optim.schedule import BatchClock, schedule_from_hparams
from t2t_lite.training.loop.trainer import simulation_line
from t2t_lite.training.opening.build import build_training

EXPONENTS = {"sqrt": 0.5, "linear": 1.0}


def _hparams(rule, unit, reference=0, optimizer="momentum"):
    return hparams(
        optimizer,
        learning_rate_batch_scaling=rule,
        learning_rate_schedule_unit=unit,
        learning_rate_reference_tokens=reference,
    )


def _hand_rates(rule, unit, reference):
    """Update u's rate, by hand: CONSTANT · linear_decay(s) · (tokens / R)^p."""
    reference = reference or WINDOWS[0] * MICRO
    train_steps = sum(WINDOWS)
    if unit == "tokens":
        horizon = train_steps * MICRO / reference
    else:
        horizon = len(WINDOWS)
    rates, trained = [], 0
    for u, size in enumerate(WINDOWS):
        step = trained / reference if unit == "tokens" else u
        decay = min(max((horizon - step) / DECAY, 0.0), 1.0)
        scale = (size * MICRO / reference) ** EXPONENTS.get(rule, 0.0)
        rates.append(CONSTANT * decay * scale)
        trained += size * MICRO
    return rates


def _micro_batches():
    return ramp_micro_batches(seed=5)


def _drive_recording_rates(step, batches):
    """Feeds batches window by window; returns each update's applied rate and the
    planned tokens the clock had counted before it."""
    rates, trained, fed = [], [], 0
    for size, first in step.windows():
        trained.append(int(step.clock.tokens_trained))
        for position in range(first, size):
            step.train_on(batches[fed], position + 1 == size)
            fed += 1
        rates.append(float(step.clock.applied_rate))
        if fed == len(batches):
            return rates, trained


@pytest.mark.parametrize(
    "rule, unit, reference",
    [
        ("sqrt", "updates", 0),
        ("linear", "updates", 0),
        ("sqrt", "tokens", 0),
        ("linear", "tokens", 0),
        ("none", "tokens", 3 * MICRO),
    ],
)
def test_each_update_equals_a_big_batch_at_the_rate_of_its_tokens(
    rule, unit, reference
):
    hp = _hparams(rule, unit, reference)
    run = build_training(
        hp,
        vocab_size=VOCAB,
        train_steps=sum(WINDOWS),
        initial_weights=list(start_weights()),
    )
    rates, trained = _drive_recording_rates(run.step, _micro_batches())
    expected = _hand_rates(rule, unit, reference)
    assert rates == pytest.approx(expected, rel=1e-6)
    # The rate changes at every update, so that no ordering bug can cancel out:
    assert all(a != pytest.approx(b) for a, b in itertools.pairwise(expected))
    assert trained == [sum(WINDOWS[:u]) * MICRO for u in range(len(WINDOWS))]
    weights, velocity = Reference(hp)(
        list(start_weights()),
        split_into_windows(uneven_micro_batches(sum(WINDOWS), seed=5), WINDOWS),
        "momentum",
        total_updates=len(WINDOWS),
        rate_of=lambda u: expected[u],
    )
    assert ratio([v.numpy() for v in run.model.trainable_variables], weights) < 1
    slots = [tf.convert_to_tensor(s).numpy() for s in run.optimizer.momentums]
    assert ratio(slots, velocity) < 1


def test_without_the_rule_the_rates_differ_from_the_rule():
    """A control: the hand-computed rates of the rule are not those of the plain
    schedule, so the test above could fail."""
    plain = _hand_rates("none", "updates", 0)
    for rule, unit in (("sqrt", "updates"), ("none", "tokens")):
        assert _hand_rates(rule, unit, 0) != pytest.approx(plain, rel=1e-3)


def test_a_resume_inside_a_window_keeps_the_rate_and_the_token_count(tmp_path):
    hp = _hparams("sqrt", "tokens")
    micro = _micro_batches()

    def fresh():
        return build_training(
            hp,
            vocab_size=VOCAB,
            train_steps=sum(WINDOWS),
            initial_weights=list(start_weights()),
        )

    whole = fresh()
    _drive_recording_rates(whole.step, micro)
    first = fresh()
    fed = 0
    for size, start in first.step.windows():  # 5 micro-steps: inside window 3
        for position in range(start, size):
            first.step.train_on(micro[fed], position + 1 == size)
            fed += 1
            if fed == 5:
                break
        if fed == 5:
            break
    assert first.step.window() == (2, 1)
    path = first.checkpoint().save(str(tmp_path / "ckpt"))
    resumed = fresh()
    resumed.checkpoint().restore(path).assert_consumed()
    rates, trained = _drive_recording_rates(resumed.step, micro[5:])
    assert rates == pytest.approx(_hand_rates("sqrt", "tokens", 0)[3:], rel=1e-6)
    assert trained[0] == sum(WINDOWS[:3]) * MICRO
    assert int(resumed.step.clock.tokens_trained) == sum(WINDOWS) * MICRO
    after = [v.numpy() for v in resumed.model.trainable_variables]
    straight = [v.numpy() for v in whole.model.trainable_variables]
    assert ratio(after, straight, rtol=1e-6) < 1


# --- Adam's betas at a fixed half-life in tokens ---------------------------------


@pytest.mark.parametrize("beta_1_follows", [False, True])
def test_adam_betas_keep_their_half_life_in_tokens(beta_1_follows):
    reference = 2 * MICRO  # windows of 1 micro-batch: β ** 0.5; of 4: β ** 2
    hp = hparams(
        "adam",
        optimizer_adam_beta1=BETA_1,
        optimizer_adam_beta2=BETA_2,
        adam_beta_tokens_reference=reference,
        adam_beta1_follows_tokens=beta_1_follows,
        learning_rate_batch_scaling="sqrt",
    )
    run = build_training(
        hp,
        vocab_size=VOCAB,
        train_steps=sum(WINDOWS),
        initial_weights=list(start_weights()),
    )
    optimizer, betas = run.optimizer, []
    fed, micro = 0, _micro_batches()
    for size, first in run.step.windows():
        betas.append([float(b) for b in optimizer.betas()])  # as the apply reads them
        for position in range(first, size):
            run.step.train_on(micro[fed], position + 1 == size)
            fed += 1
        if fed == len(micro):
            break
    expected = hand_betas(reference, beta_1_follows)
    assert betas == [pytest.approx(b, rel=1e-6) for b in expected]
    rates = _hand_rates("sqrt", "updates", 0)
    weights, (m, v) = Reference(hp)(
        list(start_weights()),
        split_into_windows(uneven_micro_batches(sum(WINDOWS), seed=5), WINDOWS),
        "adam",
        total_updates=len(WINDOWS),
        rate_of=lambda u: rates[u],
        betas_of=lambda u: expected[u],
    )
    assert ratio([w.numpy() for w in run.model.trainable_variables], weights) < 1
    assert ratio([tf.convert_to_tensor(s).numpy() for s in optimizer._momentums], m) < 1
    assert (
        ratio([tf.convert_to_tensor(s).numpy() for s in optimizer._velocities], v) < 1
    )
    # A control: Adam's own constant betas give other weights.
    plain = build_training(
        hp.copy().override(
            adam_beta_tokens_reference=0, adam_beta1_follows_tokens=False
        ),
        vocab_size=VOCAB,
        train_steps=sum(WINDOWS),
        initial_weights=list(start_weights()),
    )
    _drive_recording_rates(plain.step, _micro_batches())
    assert ratio([w.numpy() for w in plain.model.trainable_variables], weights) > 1


# --- the schedule in tokens -------------------------------------------------------


def _warmup_rates(n, updates, unit):
    """(planned tokens before each update, its rate) of a fixed n under a linear
    warmup of 4 update-equivalents at a reference of 4 micro-batches."""
    hp = tiny_hparams(
        optimizer="sgd",
        batch_size=MICRO,
        optimizer_multistep_accumulate_steps=n,
        learning_rate_constant=CONSTANT,
        learning_rate_schedule="constant*linear_warmup",
        learning_rate_warmup_steps=4,
        learning_rate_schedule_unit=unit,
        learning_rate_reference_tokens=4 * MICRO,
    )
    plan = plan_from_hparams(hp)
    clock = BatchClock()
    schedule = schedule_from_hparams(hp, updates * n, plan, clock)
    out = []
    for u in range(updates):
        clock.window_tokens.assign(plan.tokens(u))
        out.append((int(clock.tokens_trained), float(schedule(u))))
        clock.tokens_trained.assign_add(plan.tokens(u))
    return dict(out)


def test_a_schedule_in_tokens_warms_up_over_the_same_tokens_whatever_the_batch():
    small = _warmup_rates(n=1, updates=20, unit="tokens")  # 64 tokens per update
    large = _warmup_rates(n=4, updates=5, unit="tokens")  # 256 tokens per update
    for tokens in large:
        assert large[tokens] == pytest.approx(small[tokens], rel=1e-6)
    warm = 4 * 4 * MICRO  # 4 update-equivalents of the 256-token reference
    assert small[warm] == large[warm] == pytest.approx(CONSTANT)
    assert small[warm - MICRO] < CONSTANT and large[warm - 4 * MICRO] < CONSTANT
    # Counted in updates, the small batch warms up on a quarter of the tokens:
    updates = _warmup_rates(n=1, updates=20, unit="updates")
    assert updates[4 * MICRO] == pytest.approx(CONSTANT)
    assert updates[4 * MICRO] > small[4 * MICRO]


def test_the_token_unit_at_the_reference_batch_is_the_update_unit():
    tokens = _warmup_rates(n=4, updates=8, unit="tokens")
    updates = _warmup_rates(n=4, updates=8, unit="updates")
    assert list(tokens.values()) == list(updates.values())


# --- bad input and the start-up line ----------------------------------------------


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"learning_rate_batch_scaling": "cubic"}, ["none, sqrt, linear", "cubic"]),
        ({"learning_rate_schedule_unit": "epochs"}, ["updates, tokens", "epochs"]),
        ({"learning_rate_reference_tokens": -1}, [">= 0"]),
        ({"learning_rate_reference_tokens": MICRO - 1}, ["at least one micro-batch"]),
        ({"adam_beta_tokens_reference": MICRO - 1}, ["at least one micro-batch"]),
        ({"adam_beta_tokens_reference": 4 * MICRO}, ["optimizer 'sgd' has none"]),
        ({"adam_beta1_follows_tokens": True}, ["with adam_beta_tokens_reference"]),
    ],
)
def test_bad_rate_rules_are_one_line_errors(overrides, words):
    with pytest.raises(HParamsError) as error:
        hparams_checks.validate(hparams("sgd", **overrides))
    message = str(error.value)
    assert "\n" not in message and next(iter(overrides)) in message
    for word in words:
        assert word in message


def test_t2t_trainer_refuses_an_unknown_rule_before_writing(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "trainer",
        "--problem=algorithmic_reverse",
        "--hparams_set=transformer_test",
        "--hparams=learning_rate_batch_scaling=square",
        f"--output_dir={out}",
        "--train_steps=2",
    )
    assert_user_error(result, "t2t-trainer", "learning_rate_batch_scaling", "square")
    assert not out.exists()


def test_the_start_up_line_states_the_rule():
    hp = _hparams("sqrt", "tokens")
    line = simulation_line(hp, 1, plan_from_hparams(hp))
    assert f"learning rate × (tokens/update ÷ {MICRO})^0.5" in line
    assert f"schedule step = tokens trained on ÷ {MICRO}" in line
    adam = hparams("adam", adam_beta_tokens_reference=4 * MICRO)
    line = simulation_line(adam, 1, plan_from_hparams(adam))
    assert f"Adam beta2 ** (tokens/update ÷ {4 * MICRO})" in line
    plain = hparams("sgd")
    assert "learning rate" not in simulation_line(plain, 1, plan_from_hparams(plain))
