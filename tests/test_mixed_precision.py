"""Mixed precision (activation_dtype bfloat16 / float16) and float16 loss scaling.

What must hold (docs/design.md §2.3): the model computes in the low dtype while
weights, optimizer slots and accumulators stay float32; accumulation still equals the
big batch (to a looser, stated tolerance); under float16 an overflow in one micro-batch
skips exactly that update and lowers the scale, and the run resumes mid-window exactly.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
from support.accumulation_helpers import (
    VOCAB,
    build,
    concatenate,
    run,
    seeded_weights,
    tiny_hparams,
    tolerance_ratio,
    uneven_micro_batches,
)
from support.cli_helpers import run_cli

from t2t_lite.models.losses import token_loss
from t2t_lite.training.opening.build import build_training
from t2t_lite.training.step.loss_scale import INITIAL_SCALE

LOW_DTYPES = ("bfloat16", "float16")
SEED = 20261130  # of the initial weights (seeded_weights)


def _hp(dtype, n=1, **overrides):
    return tiny_hparams(
        activation_dtype=dtype, optimizer_multistep_accumulate_steps=n, **overrides
    )


def _as_tensors(batch):
    return {k: tf.constant(v) for k, v in batch.items()}


N, UPDATES = 3, 3


@functools.cache
def _accumulated(dtype, optimizer):
    """(model, step, its weights, its update step) after UPDATES updates of N
    micro-batches each, from seeded_weights(SEED). Built once per setting: the
    equivalence test reads the weights and update step recorded here, the state test
    then takes the run one (accumulate-only) micro-step further."""
    hp = _hp(dtype, n=N, optimizer=optimizer)
    model, step = build(hp, N * UPDATES, initial_weights=seeded_weights(SEED))
    run(step, uneven_micro_batches(N * UPDATES))
    return model, step, tuple(model.get_weights()), step.update_step


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_computes_low_but_keeps_float32_state(dtype):
    model, step, _, _ = _accumulated(dtype, "adam")  # UPDATES updates, then ...
    run(step, uneven_micro_batches(1), start=step.micro_step)  # ... one micro-step
    assert not step.is_update_micro_step(step.micro_step - 1)  # into a window
    batch = _as_tensors(uneven_micro_batches(1)[0])
    encoder_output, bias = model.encode(batch["inputs"])
    assert encoder_output.dtype == dtype and bias.dtype == dtype
    assert model(batch).dtype == tf.float32  # logits, hence the loss, are float32
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
    slots = [v for v in step.optimizer.variables if len(v.shape) > 0]
    assert slots and {v.dtype for v in slots} == {"float32"}
    assert {v.dtype for v in step.accumulator.gradients} == {tf.float32}
    assert float(tf.reduce_sum(tf.abs(step.accumulator.gradients[0]))) > 0


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_trains(dtype):
    """The loss on a fixed batch falls over 12 updates (learning from it)."""
    batches = uneven_micro_batches(4, seed=3)
    model, step = build(
        _hp(dtype, learning_rate_schedule="constant", learning_rate_constant=0.02),
        train_steps=12,
        initial_weights=seeded_weights(SEED),
    )

    def loss():
        total = [token_loss(model(_as_tensors(b)), b["targets"], 0.1) for b in batches]
        return sum(float(s) for s, _ in total) / sum(float(t) for _, t in total)

    before = loss()
    run(step, batches * 3)
    assert step.update_step == 12 and int(step.skipped_updates) == 0
    assert loss() < 0.8 * before


def _relative_update_error(weights, reference, start):
    """||weights - reference|| / ||reference - start||: how far two runs' weights
    are apart, relative to how far the reference run moved them."""

    def flat(weights):
        return np.concatenate([w.ravel() for w in weights]).astype(np.float64)

    ref = flat(reference)
    moved = np.linalg.norm(ref - flat(start))
    assert moved > 1e-4, "the updates did not move the weights enough to compare"
    return np.linalg.norm(flat(weights) - ref) / moved


@pytest.mark.parametrize(
    "dtype, optimizer, tolerance",
    # The accumulated and big-batch runs round in different places: bfloat16 keeps 8
    # mantissa bits, float16 11. Measured relative update errors after 3 updates
    # (2026-11-30): float32 ~1e-6; sgd 1.6e-3 (bfloat16), 2.4e-4 (float16); adam
    # 8e-3 / 9e-3 (Adam's normalization lifts the rounding noise of tiny gradients to
    # full-size steps). Tolerances are ~3x those.
    [
        ("bfloat16", "sgd", 5e-3),
        ("float16", "sgd", 1e-3),
        ("bfloat16", "adam", 3e-2),
        ("float16", "adam", 3e-2),
    ],
)
def test_low_precision_accumulation_equals_big_batch(dtype, optimizer, tolerance):
    start = seeded_weights(SEED)
    micro = uneven_micro_batches(N * UPDATES)
    _, _, accumulated, update_step = _accumulated(dtype, optimizer)
    hp = _hp(dtype, optimizer=optimizer)
    big, big_step = build(hp, UPDATES, initial_weights=start)
    run(big_step, [concatenate(micro[u * N : (u + 1) * N]) for u in range(UPDATES)])
    assert update_step == big_step.update_step == UPDATES
    error = _relative_update_error(accumulated, big.get_weights(), start)
    assert error < tolerance, f"{dtype}/{optimizer}: accumulated != big ({error:.2e})"


def _float16_run(start, n=2):
    return build_training(
        _hp("float16", n=n), vocab_size=VOCAB, train_steps=8, initial_weights=start
    )


def test_float16_overflow_skips_exactly_that_update():
    """Window 1 overflows in its first micro-batch (a forced huge scale): the whole
    update is skipped, the scale halves, the overflow is counted apart from
    divergence; window 2's update then equals a clean run's first update."""
    start, micro = seeded_weights(SEED), uneven_micro_batches(4)
    forced = _float16_run(start)
    scale = forced.step.loss_scale
    scale.scale.assign(1e30)  # float16 gradients overflow to inf
    run(forced.step, micro[:1])
    scale.scale.assign(INITIAL_SCALE)
    run(forced.step, micro[1:2], start=1)
    assert forced.step.update_step == 0
    assert float(scale.scale) == INITIAL_SCALE / 2 and int(scale.overflows) == 1
    assert int(forced.step.skipped_updates) == 0  # not a divergence
    assert int(forced.step.bad_updates_in_a_row) == 0
    for got, want in zip(forced.model.get_weights(), start):
        np.testing.assert_array_equal(got, want)
    run(forced.step, micro[2:4], start=2)

    clean = _float16_run(start)
    run(clean.step, micro[2:4])
    assert forced.step.update_step == clean.step.update_step == 1
    ratio = tolerance_ratio(forced.model, clean.model, rtol=1e-6, atol=1e-9)
    assert ratio < 1.0, f"update after the overflow differs (ratio {ratio:.3f})"


def test_float16_scale_grows_after_growth_interval():
    run_ = _float16_run(seeded_weights(SEED), n=1)
    scale = run_.step.loss_scale
    scale.growth_interval = 2
    run_.step.recompile()  # growth_interval is read when the step is traced
    run(run_.step, uneven_micro_batches(3))
    assert float(scale.scale) == INITIAL_SCALE * 2 and int(scale.good_updates) == 1


def test_float16_resumes_mid_window_exactly(tmp_path):
    """Saved after micro-step 3 of 2-step windows (mid-window: accumulators hold
    scaled sums) and restored into a fresh run: same weights and scale as the saved
    run gets by going on uninterrupted, bitwise."""
    start, micro = seeded_weights(SEED), uneven_micro_batches(6)
    whole = _float16_run(start)
    run(whole.step, micro[:3])
    path = whole.checkpoint().save(str(tmp_path / "ckpt"))  # reads, changes nothing
    run(whole.step, micro[3:], start=3)

    resumed = _float16_run(seeded_weights(SEED))
    resumed.checkpoint().restore(path).assert_consumed()
    assert resumed.step.micro_step == 3
    run(resumed.step, micro[3:], start=3)
    for got, want in zip(resumed.model.get_weights(), whole.model.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert float(resumed.step.loss_scale.scale) == float(whole.step.loss_scale.scale)


def test_float16_run_trains_averages_and_decodes_through_the_clis(
    numbers_run, tmp_path
):
    """A float16 run (n=2) through t2t-trainer, t2t-avg-all and t2t-decoder."""
    run_dir, avg = tmp_path / "run", tmp_path / "avg"
    data = f"--data_dir={numbers_run.data_dir}"
    trained = run_cli(
        "trainer",
        "--problem=translate_numbers_en_fr",
        "--model=transformer",
        "--hparams_set=transformer_test",
        "--hparams=activation_dtype=float16,optimizer_multistep_accumulate_steps=2",
        data,
        f"--output_dir={run_dir}",
        "--train_steps=8",
        "--save_checkpoints_steps=4",
        "--eval_steps=2",
        "--log_steps=4",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "loss scale 32768 (0 overflow updates skipped)" in trained.stderr
    averaged = run_cli(
        "avg_checkpoints", f"--model_dir={run_dir}", f"--output_dir={avg}", "--n=2"
    )
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    source = tmp_path / "in.en"
    source.write_text("one hundred\ntwenty three\n")
    for model_dir in (run_dir, avg):
        decoded = run_cli(
            "decoder",
            f"--output_dir={model_dir}",
            data,
            "--decode_hparams=beam_size=2",
            f"--decode_from_file={source}",
            f"--decode_to_file={model_dir}.out",
        )
        assert decoded.returncode == 0, decoded.stderr[-3000:]
        with open(f"{model_dir}.out") as decodings:
            assert len(decodings.read().splitlines()) == 2
