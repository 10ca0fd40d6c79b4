"""Named hparams sets, with T2T's values (docs/design.md §3).

`transformer_base` declares every hyperparameter once, each with a one-line comment;
every other set starts from a registered set and only overrides values.
"""

from t2t_lite.hparams import HParams
from t2t_lite.registry import HPARAMS_SETS


# Every hparam is declared here once, one statement each (design.md §5).
@HPARAMS_SETS.register()
def transformer_base():  # noqa: PLR0915
    """T2T's transformer_base (v2): pre-norm, 6+6 layers of 512, Adam 0.9/0.997."""
    hp = HParams()
    d = hp.declare
    # --- Model ---
    d("hidden_size", 512)  # model width (embeddings, attention, residual)
    d("filter_size", 2048)  # width of the feed-forward hidden layer
    d("num_hidden_layers", 6)  # layers in encoder and decoder, unless below
    d("num_encoder_layers", 0)  # 0: use num_hidden_layers
    d("num_decoder_layers", 0)  # 0: use num_hidden_layers
    d("num_heads", 8)  # attention heads; must divide hidden_size
    d("layer_prepostprocess_dropout", 0.1)  # dropout on embeddings and sublayer outputs
    d("attention_dropout", 0.1)  # dropout on attention weights
    d("relu_dropout", 0.1)  # dropout after the feed-forward relu
    # One matrix for the source and target embeddings and the softmax weights:
    d("shared_embedding_and_softmax_weights", True)
    d("norm_epsilon", 1e-6)  # layer norm epsilon
    d("initializer_gain", 1.0)  # gain of the uniform unit-scaling initializer
    d("label_smoothing", 0.1)  # probability mass spread over the vocabulary
    # Compute dtype (float32, bfloat16, float16); weights, slots, accumulators, logits
    # and the loss stay float32; float16 adds dynamic loss scaling:
    d("activation_dtype", "float32")
    # Recompute each layer's activations in the backward pass instead of keeping them
    # (less memory for one more forward pass per layer; dropout masks are replayed):
    d("recompute_grad", False)
    # --- Data and batching ---
    # Tokens per replica per micro-batch, padding included; 0: the largest that fits
    # in memory (needs effective_batch_size or batch_size_schedule):
    d("batch_size", 4096)
    d("max_length", 256)  # longer examples are dropped; 0 means batch_size
    d("min_length_bucket", 8)  # smallest length bucket boundary
    d("length_bucket_step", 1.1)  # bucket boundaries grow by this factor
    # Training examples shuffled in memory. Every checkpoint holds them (a resume
    # continues with the same examples), and as many are read before the first step:
    d("shuffle_buffer_size", 10000)
    # --- Optimizer ---
    d("optimizer", "adam")  # adam, multistep_adam, sgd, momentum, adafactor
    d("optimizer_adam_beta1", 0.9)  # Adam first-moment decay
    d("optimizer_adam_beta2", 0.997)  # Adam second-moment decay
    d("optimizer_adam_epsilon", 1e-9)  # Adam epsilon
    # Tokens per update at which Adam's beta2 is optimizer_adam_beta2; at other
    # batch sizes beta2 ** (tokens / this), a half-life fixed in tokens; 0: off
    # (optim/token_adam.py):
    d("adam_beta_tokens_reference", 0)
    d("adam_beta1_follows_tokens", False)  # beta1 follows the same rule
    d("optimizer_momentum_momentum", 0.9)  # momentum optimizer's momentum
    d("optimizer_momentum_nesterov", False)  # use Nesterov momentum
    d("optimizer_adafactor_decay_rate", 0.8)  # Adafactor second-moment decay exponent
    d("optimizer_adafactor_clipping_threshold", 1.0)  # Adafactor update clipping
    # Adafactor's step min(rate, 1/sqrt(update)), as Keras's; False: the rate as
    # given, as T2T's and fairseq's relative_step=False (optim/adafactor.py):
    d("optimizer_adafactor_relative_step", True)
    d("optimizer_multistep_accumulate_steps", 1)  # micro-batches per update; 0/1: none
    # Tokens per update to aim for; 0: off. Sets n = ceil(this / (batch_size *
    # replicas)) (leave optimizer_multistep_accumulate_steps at 1):
    d("effective_batch_size", 0)
    # Tokens per update as a function of the update step, instead of a fixed n:
    # linear:START,END,UPDATES, steps:0=T0,U1=T1,...,
    # adaptive:MIN,MAX[,EVERY[,FRACTION]], fixed:TOKENS or a registered kind; "": off
    # (optim/batch_plan.py, docs/batch.md):
    d("batch_size_schedule", "")
    # Measure the gradient noise scale (critical batch size, in tokens) whenever a
    # window holds two or more micro-batches (training/step/noise_scale.py):
    d("log_noise_scale", True)
    d("noise_scale_decay", 0.95)  # its moving average's decay per update
    d("clip_grad_norm", 0.0)  # global-norm clipping per update; 0: off
    d("weight_decay", 0.0)  # L2 per update on all but biases (T2T's rule); 0: off
    d("max_consecutive_bad_updates", 10)  # NaN/Inf updates in a row that stop a run
    # --- Learning-rate schedule (evaluated in updates, never micro-steps; or in
    # update-equivalents of tokens, learning_rate_schedule_unit=tokens) ---
    d("learning_rate_schedule", "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size")
    d("learning_rate_constant", 2.0)  # the `constant` factor
    d("learning_rate_warmup_steps", 8000)  # warmup length, in the schedule's steps
    d("learning_rate_decay_steps", 5000)  # for linear_decay, cosdecay, exp_decay
    d("learning_rate_decay_rate", 1.0)  # exp_decay base
    d("learning_rate_decay_staircase", False)  # exp_decay in whole decay_steps
    # The rate follows the batch: × (planned tokens of the update / reference)^p, p
    # of none (0), sqrt (1/2) or linear (1) (docs/batch.md):
    d("learning_rate_batch_scaling", "none")
    # What the schedule's step counts: updates, or tokens trained on / reference
    # tokens (update-equivalents at the reference batch):
    d("learning_rate_schedule_unit", "updates")
    # Tokens per update of the rate's reference batch; 0: the first update's:
    d("learning_rate_reference_tokens", 0)
    return hp


@HPARAMS_SETS.register()
def transformer_base_single_gpu():
    """T2T's single-GPU variant: 1024-token batches, slower warmup."""
    return transformer_base().override(
        batch_size=1024,
        learning_rate_schedule="constant*linear_warmup*rsqrt_decay",
        learning_rate_constant=0.1,
        learning_rate_warmup_steps=16000,
    )


@HPARAMS_SETS.register()
def transformer_big():
    """T2T's transformer_big: width 1024, 16 heads."""
    return transformer_base().override(
        hidden_size=1024,
        filter_size=4096,
        num_heads=16,
        batch_size=2048,
        layer_prepostprocess_dropout=0.3,
    )


@HPARAMS_SETS.register()
def transformer_tiny():
    """T2T's transformer_tiny: 2 layers of 128."""
    return transformer_base().override(
        num_hidden_layers=2, hidden_size=128, filter_size=512, num_heads=4
    )


@HPARAMS_SETS.register()
def transformer_base_fake_gpu8():
    """transformer_base trained as on 8 GPUs: MultistepAdam over 8 micro-batches."""
    return transformer_base().override(
        optimizer="multistep_adam", optimizer_multistep_accumulate_steps=8
    )


# T2T later renamed the set; both names work.
HPARAMS_SETS.add("transformer_base_multistep8", transformer_base_fake_gpu8)


@HPARAMS_SETS.register()
def transformer_base_auto():
    """transformer_base with the batch managed for you: a time-optimal batch
    (optim/time_optimal_batch.py) that starts at transformer_base's 4096 tokens per
    update, as two micro-batches of 2048 so that the gradient noise scale is
    measured from the first update, and grows only when the measured noise scale
    and the measured cost of an update say a larger batch reaches a loss sooner;
    the learning rate follows it (sqrt of the tokens per update; warmup and decay
    counted in tokens). On one device an update's own cost is small beside its
    tokens, so it stays at 4096; it grows where updates are dear or the noise scale
    is large. scripts/bench_recipes.py measures it against fixed batches (its
    recipe `auto`): docs/batch.md#which-plan-which-rate-rule."""
    return transformer_base().override(
        batch_size=2048,
        batch_size_schedule="time_optimal",
        learning_rate_batch_scaling="sqrt",
        learning_rate_schedule_unit="tokens",
    )


@HPARAMS_SETS.register()
def transformer_tiny_fake_gpu4():
    """Quick-start set: transformer_tiny simulating 4 GPUs of 512 tokens on a CPU."""
    return transformer_tiny().override(
        batch_size=512,
        max_length=32,
        optimizer="multistep_adam",
        optimizer_multistep_accumulate_steps=4,
        learning_rate_schedule="constant*linear_warmup*rsqrt_decay",
        learning_rate_constant=0.05,
        learning_rate_warmup_steps=100,
        layer_prepostprocess_dropout=0.0,
        attention_dropout=0.0,
        relu_dropout=0.0,
    )


@HPARAMS_SETS.register()
def transformer_test():
    """A very small model for tests: seconds per run on a CPU."""
    return transformer_base().override(
        hidden_size=16,
        filter_size=32,
        num_hidden_layers=1,
        num_heads=2,
        batch_size=256,
        max_length=32,
        shuffle_buffer_size=1000,
        learning_rate_schedule="constant*linear_warmup",
        learning_rate_constant=0.01,
        learning_rate_warmup_steps=10,
    )


def with_new_keys_at_defaults(stored):
    """(hp, added): `stored` (an older run's hparams.json) with every key declared
    since then added at transformer_base's default, and the names of those keys.

    A new hparam's default keeps the behaviour that existed before it was declared
    (a rule for whoever declares one), so an older run resumes and decodes as it
    trained. Keys `stored` has that transformer_base does not (a user model's) stay.
    """
    hp, added = stored.copy(), []
    for key, value in transformer_base().values().items():
        if key not in hp:
            hp.declare(key, value)
            added.append(key)
    return hp, added
