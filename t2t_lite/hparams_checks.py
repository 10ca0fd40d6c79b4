"""Range checks on hparam values, run once before anything is built.

HParams already guarantees every key exists and has the declared type; these checks
catch values that parse but make no sense (a zero width, a dropout of 1.5, heads that
do not divide the width), so the user sees one line naming the key instead of a shape
error from deep inside TensorFlow minutes later.
"""

from t2t_lite.hparams import HParamsError
from t2t_lite.optim.schedule import parse_schedule
from t2t_lite.registry import OPTIMIZERS

_POSITIVE = (
    "hidden_size",
    "filter_size",
    "num_hidden_layers",
    "num_heads",
    "batch_size",
    "min_length_bucket",
    "max_consecutive_bad_updates",
)
_NON_NEGATIVE = (
    "num_encoder_layers",
    "num_decoder_layers",
    "max_length",
    "optimizer_multistep_accumulate_steps",
    "clip_grad_norm",
    "weight_decay",
    "learning_rate_constant",
    "learning_rate_warmup_steps",
    "learning_rate_decay_steps",
    "learning_rate_decay_rate",
    "norm_epsilon",
    "initializer_gain",
    "optimizer_adam_epsilon",
    "effective_batch_size",
)
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")
_PROBABILITIES = (  # in [0, 1)
    "layer_prepostprocess_dropout",
    "attention_dropout",
    "relu_dropout",
    "label_smoothing",
    "optimizer_adam_beta1",
    "optimizer_adam_beta2",
    "optimizer_momentum_momentum",
)


def _fail(key, value, expected):
    raise HParamsError(f"hparam '{key}' must be {expected}, got {value!r}.")


def validate(hp):
    """Raises HParamsError (one line, naming the key) for the first bad value."""
    for key in _POSITIVE:
        if getattr(hp, key) <= 0:
            _fail(key, getattr(hp, key), "> 0")
    for key in _NON_NEGATIVE:
        if getattr(hp, key) < 0:
            _fail(key, getattr(hp, key), ">= 0")
    for key in _PROBABILITIES:
        if not 0.0 <= getattr(hp, key) < 1.0:
            _fail(key, getattr(hp, key), "in [0, 1)")
    if hp.hidden_size % hp.num_heads:
        _fail("num_heads", hp.num_heads, f"a divisor of hidden_size {hp.hidden_size}")
    if hp.length_bucket_step <= 1.0:
        _fail("length_bucket_step", hp.length_bucket_step, "> 1")
    if hp.activation_dtype not in ACTIVATION_DTYPES:
        _fail("activation_dtype", hp.activation_dtype, f"one of {ACTIVATION_DTYPES}")
    if hp.effective_batch_size and hp.optimizer_multistep_accumulate_steps > 1:
        raise HParamsError(
            "hparams effective_batch_size and optimizer_multistep_accumulate_steps "
            "both set the accumulation steps; set one of them."
        )
    OPTIMIZERS.get(hp.optimizer)
    parse_schedule(hp.learning_rate_schedule)
    return hp
