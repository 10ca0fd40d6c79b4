"""Range checks on hparam values, run once before anything is built.

HParams already guarantees every key exists and has the declared type; these checks
catch values that parse but make no sense (a zero width, a dropout of 1.5, heads that
do not divide the width), so the user sees one line naming the key instead of a shape
error from deep inside TensorFlow minutes later.
"""

from t2t_lite.hparams import HParamsError
from t2t_lite.optim.batch_plan import parse_batch_size_schedule, plan_from_hparams
from t2t_lite.optim.schedule import RATE_RULES, SCHEDULE_UNITS, parse_schedule
from t2t_lite.registry import MODELS, OPTIMIZERS

# What the trainer, the data pipeline, the optimizer and the schedule read, for every
# model. A user's hparams set starts from a registered one, so it has them all.
_POSITIVE = (
    "min_length_bucket",
    "shuffle_buffer_size",
    "max_consecutive_bad_updates",
)
_NON_NEGATIVE = (
    "batch_size",  # 0: auto (training/opening/auto_batch.py)
    "max_length",
    "optimizer_multistep_accumulate_steps",
    "clip_grad_norm",
    "weight_decay",
    "learning_rate_constant",
    "learning_rate_warmup_steps",
    "learning_rate_decay_steps",
    "learning_rate_decay_rate",
    "optimizer_adam_epsilon",
    "effective_batch_size",
    "learning_rate_reference_tokens",  # 0: the first update's tokens
    "adam_beta_tokens_reference",  # 0: off
)
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")
ADAM = ("adam", "multistep_adam")  # the optimizers adam_beta_tokens_reference scales
_PROBABILITIES = (  # in [0, 1)
    "label_smoothing",
    "optimizer_adam_beta1",
    "optimizer_adam_beta2",
    "optimizer_momentum_momentum",
    "noise_scale_decay",
)
_OTHER_REQUIRED = (
    "length_bucket_step",
    "activation_dtype",
    "optimizer",
    "learning_rate_schedule",
)
# The Transformer's own keys (models/transformer.py validate_hparams): checked only
# for models that declare they use them, so a user model may ignore them.
TRANSFORMER_POSITIVE = ("hidden_size", "filter_size", "num_hidden_layers", "num_heads")
TRANSFORMER_NON_NEGATIVE = (
    "num_encoder_layers",
    "num_decoder_layers",
    "norm_epsilon",
    "initializer_gain",
)
TRANSFORMER_PROBABILITIES = (
    "layer_prepostprocess_dropout",
    "attention_dropout",
    "relu_dropout",
)


def _fail(key, value, expected):
    raise HParamsError(f"hparam '{key}' must be {expected}, got {value!r}.")


def check_ranges(hp, positive=(), non_negative=(), probabilities=()):
    """Raises HParamsError (one line, naming the key) for the first value out of
    range: > 0, >= 0, in [0, 1)."""
    for key in positive:
        if getattr(hp, key) <= 0:
            _fail(key, getattr(hp, key), "> 0")
    for key in non_negative:
        if getattr(hp, key) < 0:
            _fail(key, getattr(hp, key), ">= 0")
    for key in probabilities:
        if not 0.0 <= getattr(hp, key) < 1.0:
            _fail(key, getattr(hp, key), "in [0, 1)")


def check_transformer_hparams(hp):
    """The Transformer's checks (called through Transformer.validate_hparams)."""
    check_ranges(
        hp, TRANSFORMER_POSITIVE, TRANSFORMER_NON_NEGATIVE, TRANSFORMER_PROBABILITIES
    )
    if hp.hidden_size % hp.num_heads:
        _fail("num_heads", hp.num_heads, f"a divisor of hidden_size {hp.hidden_size}")


def validate(hp, model="transformer"):
    """Raises HParamsError (one line, naming the key) for the first bad value.

    model: a registered model name or class; its `validate_hparams(hp)` classmethod,
    if it has one, checks the keys only that model reads (None: no model checks).
    """
    required = _POSITIVE + _NON_NEGATIVE + _PROBABILITIES + _OTHER_REQUIRED
    missing = [key for key in required if key not in hp]
    if missing:
        raise HParamsError(
            f"hparams lack {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
            ", which training reads: start your hparams set from a registered one "
            "(e.g. transformer_base()) and declare only your model's new keys."
        )
    check_ranges(hp, _POSITIVE, _NON_NEGATIVE, _PROBABILITIES)
    if hp.length_bucket_step <= 1.0:
        _fail("length_bucket_step", hp.length_bucket_step, "> 1")
    if hp.activation_dtype not in ACTIVATION_DTYPES:
        _fail("activation_dtype", hp.activation_dtype, f"one of {ACTIVATION_DTYPES}")
    if hp.effective_batch_size and hp.optimizer_multistep_accumulate_steps > 1:
        raise HParamsError(
            "hparams effective_batch_size and optimizer_multistep_accumulate_steps "
            "both set the accumulation steps; set one of them."
        )
    if hp.batch_size == 0:
        _check_auto_batch_size(hp)
    if hp.batch_size_schedule:
        _check_batch_size_schedule(hp)
    elif hp.batch_size:
        plan_from_hparams(hp)  # e.g. effective_batch_size below one micro-batch
    _check_rate_rule(hp)
    model_class = MODELS.get(model) if isinstance(model, str) else model
    model_checks = getattr(model_class, "validate_hparams", None)
    if model_checks is not None:
        model_checks(hp)
    OPTIMIZERS.get(hp.optimizer)
    parse_schedule(hp.learning_rate_schedule)
    return hp


def _check_auto_batch_size(hp):
    """batch_size=0 (auto) fits the micro-batch to memory and must keep the update
    the user asked for: that takes a length to probe at and a size per update."""
    if hp.max_length <= 0:
        raise HParamsError(
            "hparams batch_size=0 (auto) probes at the longest length: it needs "
            "max_length > 0."
        )
    if not (hp.effective_batch_size or hp.batch_size_schedule):
        raise HParamsError(
            "hparams batch_size=0 (auto) needs effective_batch_size or "
            "batch_size_schedule: the tokens per update to keep while the "
            "micro-batch fits the memory."
        )
    if 0 < hp.effective_batch_size <= hp.max_length:
        raise HParamsError(
            f"hparams batch_size=0 (auto): effective_batch_size "
            f"{hp.effective_batch_size} tokens per update is less than one sentence "
            f"pair of max_length {hp.max_length} (+1)."
        )


def _check_batch_size_schedule(hp):
    """The schedule parses (on one replica; more replicas are checked when the run
    is built), is the only thing that sets n, and its kind can work with the other
    hparams."""
    for key in ("optimizer_multistep_accumulate_steps", "effective_batch_size"):
        if getattr(hp, key) > (1 if key.startswith("optimizer") else 0):
            raise HParamsError(
                f"hparams batch_size_schedule and {key} both set the accumulation "
                "steps; set one of them."
            )
    # Under batch_size=0 (auto), checked with one sentence per micro-batch.
    micro = hp.batch_size or hp.max_length + 1
    parse_batch_size_schedule(hp.batch_size_schedule, micro).check_hparams(hp)


def _check_rate_rule(hp):
    """learning_rate_batch_scaling, learning_rate_schedule_unit and the reference
    tokens name things that exist, the references hold a micro-batch, and the
    betas that follow the batch are Adam's."""
    for key, known in (
        ("learning_rate_batch_scaling", tuple(RATE_RULES)),
        ("learning_rate_schedule_unit", SCHEDULE_UNITS),
    ):
        if getattr(hp, key) not in known:
            _fail(key, getattr(hp, key), f"one of {', '.join(known)}")
    for key, zero in (
        ("learning_rate_reference_tokens", "the first update's tokens"),
        ("adam_beta_tokens_reference", "off"),
    ):
        if 0 < getattr(hp, key) < hp.batch_size:
            _fail(
                key,
                getattr(hp, key),
                f"0 ({zero}) or at least one micro-batch (batch_size {hp.batch_size})",
            )
    if hp.adam_beta_tokens_reference and hp.optimizer not in ADAM:
        raise HParamsError(
            f"hparam 'adam_beta_tokens_reference' scales Adam's betas; optimizer "
            f"'{hp.optimizer}' has none (use {' or '.join(ADAM)}, or set it to 0)."
        )
    if hp.adam_beta1_follows_tokens and not hp.adam_beta_tokens_reference:
        _fail("adam_beta1_follows_tokens", True, "set with adam_beta_tokens_reference")
