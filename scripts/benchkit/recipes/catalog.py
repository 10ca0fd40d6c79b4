"""The recipes bench_recipes.py compares: named --hparams strings over its common
model, with {b}, {b2}, ... standing for multiples of its micro-batch, and "auto" for
what the recommended hparams set changes (kept in step with the set by `set_recipe`).
"""

from t2t_lite.registry import HPARAMS_SETS

RAMP = "batch_size_schedule=linear:{b},{b4},200"
ADAPTIVE = "batch_size_schedule=adaptive:{b2},{b16},50"
SQRT = "learning_rate_batch_scaling=sqrt"
TOKENS = "learning_rate_schedule_unit=tokens"
RECIPES = {
    "fixed1": "optimizer_multistep_accumulate_steps=1",
    "fixed2": "optimizer_multistep_accumulate_steps=2",
    "fixed4": "optimizer_multistep_accumulate_steps=4",
    "fixed8": "optimizer_multistep_accumulate_steps=8",
    "ramp": RAMP,
    "adaptive": ADAPTIVE,
    "ramp_sqrt": f"{RAMP},{SQRT}",
    "ramp_sqrt_tok": f"{RAMP},{SQRT},{TOKENS}",
    "adaptive_sqrt": f"{ADAPTIVE},{SQRT}",
    "adaptive_sqrt_tok": f"{ADAPTIVE},{SQRT},{TOKENS}",
    "adaptive_linear": f"{ADAPTIVE},learning_rate_batch_scaling=linear",
    # The recommended set's recipe: what transformer_base_auto changes over
    # transformer_base (set_recipe keeps the two in step).
    "auto": "{auto}",
    # bfloat16 activations whatever --dtype says (a CPU with avx512_bf16 or AMX).
    "fixed4_bf16": "optimizer_multistep_accumulate_steps=4,activation_dtype=bfloat16",
    "auto_bf16": "{auto},activation_dtype=bfloat16",
    # fixed8 with fixed4's rate scaled by sqrt(2): the rate tuned for 4 micro-batches.
    "fixed8_sqrt": (
        "optimizer_multistep_accumulate_steps=8,"
        f"{SQRT},learning_rate_reference_tokens={{b4}}"
    ),
}
DEFAULT_RECIPES = (
    "fixed1,fixed2,fixed4,fixed8,ramp,adaptive,ramp_sqrt_tok,adaptive_sqrt,"
    "adaptive_sqrt_tok"
)


def set_recipe(name, batch_size):
    """What the registered hparams set `name` changes over transformer_base, as an
    --hparams string: the set's recipe on the benchmark's common model, whose
    micro-batch is `batch_size`. A set's own batch_size is kept as a fraction of
    transformer_base's (a set that halves the micro-batch halves the benchmark's),
    so its tokens per update relate to the fixed recipes' as they do in the sets."""
    chosen, base = HPARAMS_SETS.get(name)(), HPARAMS_SETS.get("transformer_base")()
    values = chosen.values()
    if "batch_size" in chosen.diff(base):
        values["batch_size"] = batch_size * values["batch_size"] // base.batch_size
    return ",".join(f"{key}={values[key]}" for key in chosen.diff(base))
