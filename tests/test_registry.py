"""Tests for t2t_lite.registry, the registered optimizers and the trainer's
build_hparams (docs/design.md §5: explicit registration, helpful unknown-name errors)."""

import keras
import pytest

import t2t_lite  # noqa: F401  (registers everything)
from t2t_lite import registry
from t2t_lite.bin.trainer import build_hparams
from t2t_lite.errors import UserError
from t2t_lite.hparams import HParamsError
from t2t_lite.optim.optimizers import optimizer_from_hparams
from t2t_lite.registry import (
    HPARAMS_SETS,
    MODELS,
    OPTIMIZERS,
    PROBLEMS,
    Registry,
    RegistryError,
)


def _unknown(reg, name):
    with pytest.raises(RegistryError) as info:
        reg.get(name)
    return info.value


# --- Registry ---------------------------------------------------------------------


def test_register_decorator_and_add():
    widgets = Registry("widget")

    @widgets.register()
    def spanner():
        return "spanner"

    @widgets.register("big_hammer")
    def hammer():
        return "hammer"

    widgets.add("saw", 3)
    assert widgets.names() == ["big_hammer", "saw", "spanner"]
    assert widgets.get("spanner") is spanner and widgets.get("big_hammer") is hammer
    assert widgets.get("saw") == 3
    assert "saw" in widgets and "hammer" not in widgets


def test_unknown_name_lists_registered_names_and_suggests_closest():
    error = _unknown(HPARAMS_SETS, "transformer_bsae")
    message = str(error)
    assert "hparams set 'transformer_bsae'" in message
    assert "Did you mean 'transformer_base'?" in message
    assert "Registered:" in message
    for name in HPARAMS_SETS.names():
        assert name in message


def test_unknown_name_in_each_global_registry():
    for reg, typo, closest in (
        (MODELS, "transfomer", "transformer"),
        (OPTIMIZERS, "adamm", "adam"),
        (PROBLEMS, "algorithmic_revers", "algorithmic_reverse"),
    ):
        message = str(_unknown(reg, typo))
        assert f"'{typo}'" in message and f"Did you mean '{closest}'?" in message
        assert all(name in message for name in reg.names())


def test_unknown_name_without_close_match_or_entries():
    widgets = Registry("widget")
    message = str(_unknown(widgets, "anything"))
    assert "Did you mean" not in message and "(none)" in message
    widgets.add("spanner", 1)
    message = str(_unknown(widgets, "zzzzzz"))
    assert "Did you mean" not in message and "spanner" in message


def test_duplicate_registration_is_an_error():
    widgets = Registry("widget")
    widgets.add("spanner", 1)
    with pytest.raises(RegistryError, match="widget 'spanner' is registered twice"):
        widgets.add("spanner", 2)
    with pytest.raises(RegistryError, match="twice"):
        widgets.register("spanner")(lambda: None)
    assert widgets.get("spanner") == 1  # The first registration stays.


def test_duplicate_registration_in_a_global_registry_is_refused():
    original = HPARAMS_SETS.get("transformer_base")
    with pytest.raises(RegistryError, match="'transformer_base' is registered twice"):
        HPARAMS_SETS.add("transformer_base", lambda: None)
    assert HPARAMS_SETS.get("transformer_base") is original


def test_registry_errors_are_one_line_user_errors():
    assert issubclass(RegistryError, UserError)
    widgets = Registry("widget")
    widgets.add("spanner", 1)
    errors = [_unknown(HPARAMS_SETS, "nope"), _unknown(widgets, "spaner")]
    with pytest.raises(RegistryError) as info:
        widgets.add("spanner", 1)
    errors.append(info.value)
    for error in errors:
        assert isinstance(error, UserError)
        message = str(error)
        assert message and "\n" not in message
        assert not message.startswith(("'", '"'))  # Not KeyError's quoted repr.


def test_help_text_lists_every_registry_and_name():
    text = registry.help_text()
    for reg in registry.ALL:
        assert f"{reg.kind}s:" in text
        for name in reg.names():
            assert f"  {name}" in text.splitlines()
    for name in (
        "transformer",
        "algorithmic_reverse",
        "adam",
        "multistep_adam",
        "transformer_base_fake_gpu8",
        "transformer_base_multistep8",
    ):
        assert f"  {name}" in text.splitlines()


def test_expected_names_are_registered():
    assert "transformer" in MODELS
    assert "algorithmic_reverse" in PROBLEMS
    for name in (
        "transformer_base",
        "transformer_base_single_gpu",
        "transformer_big",
        "transformer_tiny",
        "transformer_base_fake_gpu8",
        "transformer_base_multistep8",
    ):
        assert name in HPARAMS_SETS


# --- optimizers ---------------------------------------------------------------------

OPTIMIZER_NAMES = ("adam", "multistep_adam", "sgd", "momentum", "adafactor")


def _hp(**overrides):
    return HPARAMS_SETS.get("transformer_tiny")().override(**overrides)


def test_optimizer_registry_has_the_documented_names():
    assert set(OPTIMIZER_NAMES) <= set(OPTIMIZERS.names())


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_each_optimizer_builds_a_keras_optimizer(name):
    optimizer = optimizer_from_hparams(_hp(optimizer=name), 0.1)
    assert isinstance(optimizer, keras.optimizers.Optimizer)
    assert float(optimizer.learning_rate) == pytest.approx(0.1)


def test_adam_and_multistep_adam_use_the_hparams():
    hp = _hp(
        optimizer_adam_beta1=0.8, optimizer_adam_beta2=0.99, optimizer_adam_epsilon=1e-7
    )
    for name in ("adam", "multistep_adam"):
        optimizer = optimizer_from_hparams(hp.copy().override(optimizer=name), 0.1)
        assert isinstance(optimizer, keras.optimizers.Adam)
        assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (
            0.8,
            0.99,
            1e-7,
        )


def test_optimizers_do_not_turn_on_keras_clipping_decay_or_accumulation():
    for name in OPTIMIZER_NAMES:
        optimizer = optimizer_from_hparams(
            _hp(
                optimizer=name,
                clip_grad_norm=1.0,
                weight_decay=0.1,
                optimizer_multistep_accumulate_steps=4,
            ),
            0.1,
        )
        config = optimizer.get_config()
        assert config.get("global_clipnorm") is None, name
        assert config.get("clipnorm") is None, name
        assert not config.get("weight_decay"), name
        assert config.get("gradient_accumulation_steps") is None, name


def test_sgd_momentum_and_adafactor_use_the_hparams():
    assert isinstance(
        optimizer_from_hparams(_hp(optimizer="sgd"), 0.1), keras.optimizers.SGD
    )
    momentum = optimizer_from_hparams(
        _hp(
            optimizer="momentum",
            optimizer_momentum_momentum=0.7,
            optimizer_momentum_nesterov=True,
        ),
        0.1,
    )
    assert isinstance(momentum, keras.optimizers.SGD)
    assert momentum.momentum == 0.7 and momentum.nesterov is True
    adafactor = optimizer_from_hparams(
        _hp(
            optimizer="adafactor",
            optimizer_adafactor_decay_rate=0.6,
            optimizer_adafactor_clipping_threshold=2.0,
            optimizer_adafactor_relative_step=False,
        ),
        0.1,
    )
    assert isinstance(adafactor, keras.optimizers.Adafactor)
    assert adafactor.beta_2_decay == -0.6 and adafactor.clip_threshold == 2.0
    assert adafactor.relative_step is False


def test_unknown_optimizer_name_is_a_registry_error():
    with pytest.raises(RegistryError, match="Did you mean 'adam'") as info:
        optimizer_from_hparams(_hp(optimizer="adamm"), 0.1)
    assert "'adamm'" in str(info.value) and "sgd" in str(info.value)


# --- build_hparams (t2t-trainer) ----------------------------------------------------


def test_build_hparams_applies_overrides_to_the_named_set():
    hp = build_hparams("transformer_tiny", "batch_size=1024,label_smoothing=0")
    expected = HPARAMS_SETS.get("transformer_tiny")()
    assert hp.diff(expected) == ["batch_size", "label_smoothing"]
    assert hp.batch_size == 1024 and hp.label_smoothing == 0.0
    assert build_hparams("transformer_tiny", "") == expected


def test_build_hparams_unknown_set():
    with pytest.raises(RegistryError) as info:
        build_hparams("transformer_bsae", "")
    message = str(info.value)
    assert "Did you mean 'transformer_base'?" in message and "\n" not in message
    assert isinstance(info.value, UserError)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ("hiden_size=3", "Did you mean 'hidden_size'?"),
        ("hidden_size=wide", "'hidden_size' expects type int"),
        ("hidden_size", "name=value"),
        ("batch_size=1,batch_size=2", "twice"),
    ],
)
def test_build_hparams_bad_overrides(overrides, needle):
    with pytest.raises(HParamsError) as info:
        build_hparams("transformer_base", overrides)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, UserError)
