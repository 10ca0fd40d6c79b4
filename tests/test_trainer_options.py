"""Trainer options declared once (training/opening/trainer_options.py):
TrainerOptions checks itself, the t2t-trainer flags are generated from it, and
docs/training.md's table is its own."""

import dataclasses
import os

import pytest
from absl import flags
from support.cli_helpers import _activate

from t2t_lite.training.opening.trainer_options import (
    TrainerOptions,
    TrainerOptionsError,
    flag_specs,
    markdown_table,
)

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "training.md")


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("save_checkpoints_steps", 0, [">= 1", "got 0"]),
        ("train_steps", -3, [">= 1"]),
        ("train_steps", True, ["int", "True"]),
        ("train_steps", "10", ["int", "'10'"]),
        ("keep_checkpoint_max", 0, [">= 1"]),
        ("log_steps", 0, [">= 1"]),
        ("local_eval_frequency", -1, [">= 0"]),
        ("random_seed", 2**32, ["<= 4294967295"]),
        ("random_seed", -1, [">= 0"]),
        ("eval_early_stopping_steps", -1, [">= 0"]),
        ("keep_checkpoint_every_n_hours", -0.5, [">= 0.0"]),
        ("eval_early_stopping_metric", "blue", ["loss", "bleu", "'blue'"]),
        ("eval_early_stopping_metric_minimize", "yes", ["true/false"]),
        ("eval_decode_hparams", "beam_size=0", ["beam_size", ">= 1"]),
        ("eval_decode_hparams", "beam_sise=2", ["beam_sise"]),
        ("output_dir", "", ["required"]),
        ("xla", 1, ["true/false"]),
    ],
)
def test_a_bad_value_is_a_value_error_naming_the_field(tmp_path, field, value, words):
    out = tmp_path / "run"
    kwargs = {"output_dir": str(out), field: value}
    with pytest.raises(ValueError) as info:
        TrainerOptions(**kwargs)
    assert isinstance(info.value, TrainerOptionsError)
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(field) and "\n" not in message
    for word in words:
        assert word in message
    assert not out.exists()  # nothing written


def test_good_values_pass_and_keep_their_types(tmp_path):
    config = TrainerOptions(
        output_dir=str(tmp_path),
        train_steps=1,
        local_eval_frequency=0,
        keep_checkpoint_every_n_hours=2,  # an int is a fine float
        eval_early_stopping_metric_minimize=False,
        eval_early_stopping_metric="bleu",
        eval_decode_hparams="beam_size=4,alpha=0.6",
    )
    assert config.decode_hparams().beam_size == 4
    assert TrainerOptions(output_dir="x", eval_early_stopping_metric_minimize=None)


def test_trainer_flags_are_the_trainer_options_fields():
    """Every TrainerOptions field is a t2t-trainer flag with the same default and help;
    the flags that are not fields are the CLI's own few."""
    _activate("t2t_lite.bin.trainer")
    module_flags = {
        f.name: f for f in flags.FLAGS.flags_by_module_dict()["t2t_lite.bin.trainer"]
    }
    fields = dataclasses.fields(TrainerOptions)
    for field, spec in zip(fields, flag_specs()):
        flag = module_flags[field.name]
        assert flag.default == field.default, field.name
        assert field.metadata["help"] in flag.help, field.name
        assert spec.name == field.name
    others = set(module_flags) - {f.name for f in fields}
    assert others == {
        "hparams_set",
        "hparams",
        "worker_gpu",
        "lost_worker_timeout",
        "cluster",
        "cluster_port",
        "registry_help",
    }


def test_docs_flag_table_is_generated_from_trainer_options():
    with open(DOCS, encoding="utf-8") as f:
        text = f.read()
    begin, end = "<!-- run-flags:begin -->\n", "<!-- run-flags:end -->"
    assert begin in text and end in text
    table = text[text.index(begin) + len(begin) : text.index(end)]
    assert table == markdown_table(), (
        "docs/training.md's flag table is stale: regenerate it with "
        "python -c 'from t2t_lite.training.opening.trainer_options import markdown_table; "
        "print(markdown_table())'"
    )
    for spec in flag_specs():
        assert f"`--{spec.name}`" in table
