"""Trainer options — what a training run needs besides hparams (T2T: tf.estimator's
RunConfig and the trainer flags) — declared once.

Each field of `TrainerOptions` carries its default, its help text and its allowed range.
From that one declaration:
- `TrainerOptions(...)` checks itself when built, from Python as from the command line: a
  bad value is a `TrainerOptionsError` (a ValueError) naming the field, raised before
  anything is written;
- bin/trainer.py generates t2t-trainer's absl flags (`flag_specs()`), so names,
  defaults and help cannot drift apart;
- docs/training.md's flag table is `markdown_table()` (a test keeps them equal).

Names are T2T's flag names. Step counts are global steps (micro-batches consumed).
"""

import dataclasses
import typing

from t2t_lite.constants import EVAL_METRICS
from t2t_lite.decoding.decoder import decode_hparams
from t2t_lite.errors import UserError


class TrainerOptionsError(UserError):
    """A run option out of its range; `field` names it, `requirement` says what
    was expected (the CLI prefixes "--" to the field to name its flag)."""

    def __init__(self, field, requirement):
        self.field, self.requirement = field, requirement
        super().__init__(f"{field} {requirement}")


def option(default, help, minimum=None, maximum=None, choices=None):
    """A TrainerOptions field: default, one-line help, inclusive bounds or choices."""
    return dataclasses.field(
        default=default,
        metadata={"help": help, "min": minimum, "max": maximum, "choices": choices},
    )


@dataclasses.dataclass
class TrainerOptions:
    """What a run needs besides hparams (T2T's flag names; see docs/training.md)."""

    problem: str = option(
        "algorithmic_reverse", "Registered problem name (docs/data.md)."
    )
    model: str = option("transformer", "Registered model name.")
    output_dir: str = option(
        "",
        "Where checkpoints, hparams.json, metrics.jsonl and TensorBoard logs go; a run "
        "resumes from here (required).",
    )
    train_steps: int = option(
        250000,
        "Micro-steps (batches) to train; with n accumulation steps this is n × the "
        "number of updates.",
        minimum=1,
    )
    data_dir: str = option(
        "",
        "The problem's vocabulary and TFRecords, written by t2t-datagen (the "
        "algorithmic problems generate in-process and need none).",
    )
    eval_steps: int = option(
        100, "Dev batches per evaluation; <= 0: the whole dev set."
    )
    local_eval_frequency: int = option(
        1000, "Evaluate every this many steps; 0: only at the end.", minimum=0
    )
    save_checkpoints_steps: int = option(
        1000, "Checkpoint every this many steps (and always at the end).", minimum=1
    )
    keep_checkpoint_max: int = option(
        20,
        "Checkpoints kept (the best checkpoint is kept apart, in OUTPUT_DIR/best/).",
        minimum=1,
    )
    log_steps: int = option(
        100,
        "Log a progress line (loss, lr, gradient norm, tokens/s, ETA) every this many "
        "steps. TensorFlow's own start-up and per-save log lines are hidden; set the "
        "environment variable T2T_LITE_TF_LOGS=1 to see them.",
        minimum=1,
    )
    random_seed: int = option(
        1,
        "Seed for initialization, dropout and shuffling.",
        minimum=0,
        maximum=2**32 - 1,
    )
    deterministic: bool = option(
        False,
        "Enable TensorFlow op determinism: two runs with the same flags give bitwise "
        "identical weights (slower).",
    )
    xla: bool = option(
        False,
        "Compile the forward and backward pass with XLA (jit_compile); training "
        "batches are padded to their length bucket so that XLA compiles once per "
        "bucket (seconds each). Measure before using it: on a CPU it was faster only "
        "for small models without dropout (docs/benchmarks.md).",
    )
    eval_bleu_sentences: int = option(
        256,
        "Translation problems: dev sentences decoded for BLEU at every evaluation; "
        "0: no BLEU; < 0: the whole dev set.",
    )
    eval_decode_hparams: str = option(
        "beam_size=1",
        "Decode hparams of that BLEU (default greedy, a cheap trend; see t2t-decoder "
        "--decode_hparams).",
    )
    warm_start_from: str = option(
        "",
        "A run directory (its newest checkpoint) or checkpoint whose MODEL WEIGHTS "
        "start this new run (fine-tuning); optimizer, counters and accumulators start "
        "fresh. Ignored when output_dir already has checkpoints (the run resumes).",
    )
    eval_use_test_set: bool = option(
        False,
        "Evaluate (loss, accuracy, BLEU) on the problem's test split instead of dev "
        '(T2T\'s flag; metrics.jsonl records carry "eval_split": "test"); its '
        "data needs one (t2t-datagen --test_source/--test_target), checked before "
        "anything is written. A run already at train_steps only evaluates.",
    )
    eval_early_stopping_metric: str = option(
        "loss",
        "The metric of early stopping and of the best checkpoint (OUTPUT_DIR/best/, "
        "never deleted by keep_checkpoint_max); bleu needs a translation problem.",
        choices=EVAL_METRICS,
    )
    eval_early_stopping_metric_minimize: bool | None = option(
        None,
        "Whether lower is better for that metric (default: True for loss, False for "
        "accuracy, sequence_accuracy and bleu).",
    )
    eval_early_stopping_steps: int = option(
        0,
        "Stop when eval_early_stopping_metric has not improved for this many steps "
        "(T2T's flag; 0: never stop early). The run saves and exits 0.",
        minimum=0,
    )
    keep_checkpoint_every_n_hours: float = option(
        0.0,
        "Also keep one checkpoint per this many hours, beyond keep_checkpoint_max "
        "(T2T's flag; 0: off).",
        minimum=0.0,
    )
    memory_budget: float = option(
        0.0,
        "With batch_size=0 (auto): GB of device memory one micro-step may use at its "
        "peak (TensorFlow's allocator; weights, slots and accumulators included); "
        "required on a CPU, with TF_CPU_ALLOCATOR_USE_BFC=true in the environment, "
        "optional on a GPU, whose out-of-memory error bounds the probe anyway "
        "(docs/memory.md).",
        minimum=0.0,
    )
    memory_headroom: float = option(
        0.1,
        "With batch_size=0 (auto): the micro-batch holds this fraction fewer "
        "sentences than the largest that fit.",
        minimum=0.0,
        maximum=0.9,
    )

    def __post_init__(self):
        for field in dataclasses.fields(self):
            _check(field, getattr(self, field.name))
        if not self.output_dir:
            raise TrainerOptionsError("output_dir", "is required.")

    def decode_hparams(self):
        """eval_decode_hparams parsed (already checked when the config was built)."""
        return decode_hparams(self.eval_decode_hparams, flag="eval_decode_hparams")


def _type_name(kind):
    return "true/false" if kind is bool else kind.__name__


def _check(field, value):
    """Type, then range, then a parse of eval_decode_hparams: one TrainerOptionsError."""
    kind, meta = _base_type(field.type), field.metadata
    if value is None and field.type is not kind:  # Optional[...]: None allowed
        return
    type_ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float:
        type_ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not type_ok:
        raise TrainerOptionsError(
            field.name, f"must be {_type_name(kind)}, got {value!r}."
        )
    if meta["min"] is not None and value < meta["min"]:
        raise TrainerOptionsError(field.name, f"must be >= {meta['min']}, got {value}.")
    if meta["max"] is not None and value > meta["max"]:
        raise TrainerOptionsError(field.name, f"must be <= {meta['max']}, got {value}.")
    if meta["choices"] and value not in meta["choices"]:
        raise TrainerOptionsError(
            field.name, f"must be one of {', '.join(meta['choices'])}, got {value!r}."
        )
    if field.name == "eval_decode_hparams":
        try:
            decode_hparams(value, flag="eval_decode_hparams")
        except UserError as e:
            # decode_hparams' message starts with the name; keep the rest.
            raise TrainerOptionsError(
                field.name, str(e).removeprefix("eval_decode_hparams").lstrip(": ")
            ) from None


def _base_type(annotation):
    """bool for Optional[bool]; the annotation itself otherwise."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """One command-line flag derived from a TrainerOptions field."""

    name: str
    kind: type  # str, int, float or bool
    default: object
    help: str
    choices: tuple = None


def flag_specs():
    """The TrainerOptions fields as flags, in declaration order, help with its range."""
    specs = []
    for field in dataclasses.fields(TrainerOptions):
        meta = field.metadata
        specs.append(
            FlagSpec(
                name=field.name,
                kind=_base_type(field.type),
                default=field.default,
                help=meta["help"] + _range_text(meta),
                choices=tuple(meta["choices"]) if meta["choices"] else None,
            )
        )
    return specs


def _range_text(meta):
    if meta["min"] is not None and meta["max"] is not None:
        return f" Range: [{meta['min']}, {meta['max']}]."
    if meta["min"] is not None:
        return f" At least {meta['min']}."
    return ""


def markdown_table():
    """docs/training.md's table of the run options (flag, default, meaning)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for spec in flag_specs():
        default = spec.default
        if spec.kind is bool and default is not None:
            default = str(default).lower()
        shown = "(none)" if default in ("", None) else f"`{default}`"
        meaning = spec.help.replace("|", "\\|")
        if spec.choices:
            meaning += f" One of: {', '.join(spec.choices)}."
        rows.append(f"| `--{spec.name}` | {shown} | {meaning} |")
    return "\n".join(rows) + "\n"
