"""Tests for t2t_lite.hparams and the registered hparams sets (docs/design.md §3, §5, §6)."""

import pytest

import t2t_lite  # noqa: F401  (registers everything)
from t2t_lite.errors import UserError
from t2t_lite.hparams import HParams, HParamsError
from t2t_lite.registry import HPARAMS_SETS


def _small():
    return HParams(a=0, b=0.0, c=False, d="x")


def _base():
    return HPARAMS_SETS.get("transformer_base")()


def _raises(text, hp=None):
    """The HParamsError raised by (hp or _small()).parse(text)."""
    with pytest.raises(HParamsError) as info:
        (hp or _small()).parse(text)
    return info.value


# --- parse: values and types ------------------------------------------------------


def test_parse_coerces_each_type():
    hp = _small().parse("a=1,b=0.5,c=true,d=name")
    assert hp.values() == {"a": 1, "b": 0.5, "c": True, "d": "name"}
    assert type(hp.a) is int and type(hp.b) is float
    assert type(hp.c) is bool and type(hp.d) is str


def test_parse_returns_the_same_object():
    hp = _small()
    assert hp.parse("a=2") is hp


def test_int_is_accepted_for_a_float_key_and_becomes_float():
    hp = _small().parse("b=3")
    assert hp.b == 3.0 and type(hp.b) is float
    hp.override(b=4)
    assert hp.b == 4.0 and type(hp.b) is float


@pytest.mark.parametrize(
    "text,expected",
    [
        ("true", True),
        ("false", False),
        ("1", True),
        ("0", False),
        ("yes", True),
        ("no", False),
        ("True", True),
        ("FALSE", False),
    ],
)
def test_bool_spellings(text, expected):
    hp = _small().override(c=not expected)
    assert hp.parse(f"c={text}").c is expected


@pytest.mark.parametrize("text", ["c=maybe", "c=2", "c="])
def test_bad_bool_is_an_error(text):
    error = _raises(text)
    assert "'c'" in str(error) and "bool" in str(error)


def test_bool_is_not_accepted_for_an_int_key():
    assert "'a'" in str(_raises("a=true"))
    with pytest.raises(HParamsError, match=r"'a'.*int"):
        _small().override(a=True)


def test_float_is_not_accepted_for_an_int_key():
    assert "int" in str(_raises("a=2.5"))
    with pytest.raises(HParamsError, match=r"'a'.*int"):
        _small().override(a=2.0)


@pytest.mark.parametrize(
    "text,key,kind",
    [("a=x", "a", "int"), ("b=fast", "b", "float"), ("c=perhaps", "c", "bool")],
)
def test_bad_value_error_names_key_and_type(text, key, kind):
    message = str(_raises(text))
    assert f"'{key}'" in message and kind in message


def test_wrong_python_type_for_a_str_key_is_an_error():
    with pytest.raises(HParamsError, match=r"'d'.*str"):
        _small().override(d=5)


# --- parse: names and syntax ------------------------------------------------------


def test_unknown_key_suggests_the_closest_name():
    message = str(_raises("hiden_size=3", _base()))
    assert "hiden_size" in message
    assert "Did you mean 'hidden_size'?" in message


def test_unknown_key_without_a_close_name_has_no_suggestion():
    message = str(_raises("zzzzzzzz=1"))
    assert "zzzzzzzz" in message and "Did you mean" not in message


@pytest.mark.parametrize("text", ["a", "a=1,b", "=1", " =1", "a=1,=2"])
def test_missing_equals_or_empty_key_is_an_error(text):
    message = str(_raises(text))
    assert "name=value" in message


def test_key_given_twice_is_an_error():
    message = str(_raises("a=1,b=2,a=3"))
    assert "'a'" in message and "twice" in message
    assert "twice" in str(_raises("a=1, a =1"))


def test_failed_parse_names_the_offending_piece():
    assert "'oops'" in str(_raises("a=1,oops"))


def test_whitespace_is_tolerated():
    hp = _small().parse("  a = 7 ,b=\t0.25 ,  c = yes , d = hello ")
    assert hp.values() == {"a": 7, "b": 0.25, "c": True, "d": "hello"}


@pytest.mark.parametrize("text", ["", "   ", ","])
def test_empty_overrides_are_a_no_op(text):
    hp = _base()
    assert hp.parse(text) == _base()


def test_errors_are_one_line_user_errors():
    assert issubclass(HParamsError, UserError)
    hp = _base()
    for text in (
        "hiden_size=3",
        "hidden_size=big",
        "hidden_size",
        "=3",
        "hidden_size=1,hidden_size=2",
        "shared_embedding_and_softmax_weights=2",
    ):
        error = _raises(text, hp)
        assert isinstance(error, UserError)
        assert "\n" not in str(error) and str(error)


# --- attribute access, declare ------------------------------------------------------


def test_attribute_access_and_assignment_are_checked():
    hp = _base()
    hp.hidden_size = 256
    assert hp.hidden_size == 256
    with pytest.raises(HParamsError, match="Did you mean 'hidden_size'"):
        hp.hiden_size = 3
    with pytest.raises(AttributeError, match="Did you mean 'hidden_size'"):
        _ = hp.hiden_size
    with pytest.raises(HParamsError, match="hidden_size"):
        hp.hidden_size = "wide"
    assert "hidden_size" in hp and "hiden_size" not in hp


def test_declare_twice_is_an_error():
    hp = HParams(a=1)
    with pytest.raises(HParamsError, match=r"'a'.*twice"):
        hp.declare("a", 2)
    assert hp.a == 1
    with pytest.raises(HParamsError, match=r"'hidden_size'.*twice"):
        _base().declare("hidden_size", 512)


@pytest.mark.parametrize("default", [None, [1], {"x": 1}, (1,)])
def test_declare_rejects_unsupported_types(default):
    with pytest.raises(HParamsError, match="'k'"):
        HParams().declare("k", default)


# --- JSON, copy, diff ------------------------------------------------------------


def test_json_round_trip_keeps_values_and_types():
    hp = _base().parse("hidden_size=64,learning_rate_constant=0.3,optimizer=sgd")
    back = HParams.from_json(hp.to_json())
    assert back == hp
    assert back.diff(hp) == []
    for key, value in hp.values().items():
        assert type(back.values()[key]) is type(value), key
    # Types stay locked after the round trip.
    with pytest.raises(HParamsError):
        back.parse("hidden_size=1.5")


def test_json_round_trip_of_every_registered_set():
    for name in HPARAMS_SETS.names():
        hp = HPARAMS_SETS.get(name)()
        assert HParams.from_json(hp.to_json()) == hp, name


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "{'a': 1}",
        "not json",
        '{"a": 1,}',
        "[1, 2]",
        "3",
        '"a"',
        '{"a": null}',
        '{"a": [1]}',
    ],
)
def test_from_json_of_malformed_text_is_a_one_line_hparams_error(text):
    with pytest.raises(HParamsError) as info:
        HParams.from_json(text)
    assert "\n" not in str(info.value)


def test_from_json_with_a_key_named_self():
    assert HParams.from_json('{"self": 1}').values() == {"self": 1}


def test_copy_is_independent():
    hp = _base()
    other = hp.copy()
    assert other == hp and other is not hp
    other.hidden_size = 64
    other.parse("optimizer=sgd")
    assert hp.hidden_size == 512 and hp.optimizer == "adam"
    hp.batch_size = 1
    assert other.batch_size == 4096
    with pytest.raises(HParamsError):  # Types and keys carry over to the copy.
        other.parse("hidden_size=x")
    with pytest.raises(HParamsError):
        other.parse("new_key=1")


def test_diff_lists_the_differing_keys():
    hp = _base()
    other = hp.copy().parse("hidden_size=64,optimizer=sgd")
    assert hp.diff(other) == ["hidden_size", "optimizer"]
    assert other.diff(hp) == ["hidden_size", "optimizer"]
    assert hp.diff(hp.copy()) == []
    assert HParams(a=1).diff(HParams(b=1)) == ["a", "b"]


def test_equality_compares_values():
    assert _base() == _base()
    assert _base() != _base().parse("batch_size=1")
    assert _base() != "transformer_base"


# --- registered hparams sets -------------------------------------------------------

SET_NAMES = HPARAMS_SETS.names()


@pytest.mark.parametrize("name", SET_NAMES)
def test_every_set_builds_with_exactly_the_base_keys(name):
    hp = HPARAMS_SETS.get(name)()
    assert isinstance(hp, HParams)
    assert set(hp.values()) == set(_base().values())
    for key, value in _base().values().items():
        assert type(hp.values()[key]) is type(value), key


@pytest.mark.parametrize("name", SET_NAMES)
def test_every_set_returns_a_fresh_object(name):
    build = HPARAMS_SETS.get(name)
    first = build()
    first.batch_size = 3
    assert build().batch_size != 3


def test_transformer_base_values():
    hp = _base()
    expected = {
        "hidden_size": 512,
        "filter_size": 2048,
        "num_hidden_layers": 6,
        "num_heads": 8,
        "batch_size": 4096,
        "max_length": 256,
        "optimizer": "adam",
        "optimizer_adam_beta1": 0.9,
        "optimizer_adam_beta2": 0.997,
        "optimizer_adam_epsilon": 1e-9,
        "label_smoothing": 0.1,
        "layer_prepostprocess_dropout": 0.1,
        "attention_dropout": 0.1,
        "relu_dropout": 0.1,
        "learning_rate_schedule": "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size",
        "learning_rate_constant": 2.0,
        "learning_rate_warmup_steps": 8000,
        "clip_grad_norm": 0.0,
        "weight_decay": 0.0,
        "shared_embedding_and_softmax_weights": True,
        "norm_epsilon": 1e-6,
        "optimizer_multistep_accumulate_steps": 1,
        "initializer_gain": 1.0,
        "min_length_bucket": 8,
        "length_bucket_step": 1.1,
    }
    for key, value in expected.items():
        assert hp.values()[key] == value, key
    # 0 means "use num_hidden_layers": 6+6 layers.
    assert hp.num_encoder_layers in (0, 6) and hp.num_decoder_layers in (0, 6)


def test_transformer_base_single_gpu_values():
    hp = HPARAMS_SETS.get("transformer_base_single_gpu")()
    assert hp.batch_size == 1024
    assert hp.learning_rate_schedule == "constant*linear_warmup*rsqrt_decay"
    assert hp.learning_rate_constant == 0.1
    assert hp.learning_rate_warmup_steps == 16000
    assert hp.diff(_base()) == sorted(
        [
            "batch_size",
            "learning_rate_schedule",
            "learning_rate_constant",
            "learning_rate_warmup_steps",
        ]
    )


def test_transformer_big_values():
    hp = HPARAMS_SETS.get("transformer_big")()
    assert (hp.hidden_size, hp.filter_size, hp.num_heads) == (1024, 4096, 16)
    assert hp.batch_size == 2048
    assert hp.layer_prepostprocess_dropout == 0.3
    assert hp.diff(_base()) == sorted(
        [
            "hidden_size",
            "filter_size",
            "num_heads",
            "batch_size",
            "layer_prepostprocess_dropout",
        ]
    )


def test_transformer_tiny_values():
    hp = HPARAMS_SETS.get("transformer_tiny")()
    assert (hp.num_hidden_layers, hp.hidden_size, hp.filter_size, hp.num_heads) == (
        2,
        128,
        512,
        4,
    )
    assert hp.diff(_base()) == sorted(
        ["num_hidden_layers", "hidden_size", "filter_size", "num_heads"]
    )


def test_fake_gpu8_and_multistep8_are_the_same_set():
    fake = HPARAMS_SETS.get("transformer_base_fake_gpu8")()
    multistep = HPARAMS_SETS.get("transformer_base_multistep8")()
    assert fake == multistep
    assert fake.optimizer == "multistep_adam"
    assert fake.optimizer_multistep_accumulate_steps == 8
    assert fake.diff(_base()) == ["optimizer", "optimizer_multistep_accumulate_steps"]


def test_transformer_base_auto_is_base_with_the_managed_batch():
    from t2t_lite.hparams_checks import validate
    from t2t_lite.optim.batch_plan import plan_from_hparams

    auto = HPARAMS_SETS.get("transformer_base_auto")()
    base = _base()
    assert auto.diff(base) == [
        "batch_size",
        "batch_size_schedule",
        "learning_rate_batch_scaling",
        "learning_rate_schedule_unit",
    ]
    validate(auto)
    plan = plan_from_hparams(auto, replicas=2)
    assert plan.kind == "time_optimal" and plan.given_cost is None  # measured
    # It starts at transformer_base's tokens per update, as two micro-batches of
    # half the size (the noise scale needs two):
    assert plan.minimum == 2 * auto.batch_size * 2 == base.batch_size * 2
    assert plan.maximum == 64 * auto.batch_size * 2
    # transformer_base_fake_gpu8 keeps T2T's meaning: a fixed 8.
    assert plan_from_hparams(HPARAMS_SETS.get("transformer_base_fake_gpu8")()).n == 8


@pytest.mark.parametrize("name", ["values", "parse", "copy", "_values"])
def test_names_that_would_hide_methods_are_refused(name):
    with pytest.raises(HParamsError, match=name):
        HParams().declare(name, 1)


def test_a_comma_followed_by_a_digit_stays_in_the_value():
    hp = _base().parse("batch_size_schedule=linear:8192,65536,2000,hidden_size=64")
    assert hp.batch_size_schedule == "linear:8192,65536,2000" and hp.hidden_size == 64
    hp = _base().parse("batch_size_schedule=steps:0=8192,1000=32768")
    assert hp.batch_size_schedule == "steps:0=8192,1000=32768"
