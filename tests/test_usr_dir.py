"""--t2t_usr_dir: a user's package registers an hparams set, a problem, a model, an
optimizer and a schedule factor, and the CLIs train and decode with them (README:
Extending)."""

import json
import math
import os
import textwrap

import pytest
from support.cli_helpers import assert_user_error, run_cli

from t2t_lite import registry
from t2t_lite.errors import UserError
from t2t_lite.hparams_checks import validate
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.usr_dir import import_usr_dir

# A GRU encoder-decoder: not a Transformer, no decode_step (the decoder falls back to
# recomputing the prefix), hparams of its own (gru_units), a problem of its own.
USER_PACKAGE = """
import keras
import tensorflow as tf

from t2t_lite.data.problems import AlgorithmicIdentity
from t2t_lite.hparams import HParamsError
from t2t_lite.hparams_sets import transformer_test
from t2t_lite.optim import schedule
from t2t_lite.registry import HPARAMS_SETS, MODELS, OPTIMIZERS, PROBLEMS


@HPARAMS_SETS.register()
def my_gru_tiny():
    hp = transformer_test()
    hp.declare("gru_units", 24)  # a key only this model reads
    hp.num_heads = 7  # meaningless here: the Transformer's checks must not run
    hp.learning_rate_schedule = "my_constant"
    hp.learning_rate_constant = 0.02
    hp.optimizer = "my_adam"
    return hp


@schedule.register_factor
def my_constant(step, config):
    del step
    return tf.constant(config.constant, tf.float32)


@OPTIMIZERS.register("my_adam")
def my_adam(hp, learning_rate):
    return keras.optimizers.Adam(learning_rate)


class MyCopyProblem(AlgorithmicIdentity):
    name = "my_copy"

    def __init__(self):
        super().__init__(num_symbols=8, min_length=2, max_length=5,
                         train_size=400, dev_size=16, seed=3)


PROBLEMS.add(MyCopyProblem.name, MyCopyProblem)


@MODELS.register("my_gru")
class MyGru(keras.Model):
    def __init__(self, vocab_size, units, **kwargs):
        super().__init__(**kwargs)
        self._vocab_size = vocab_size
        self.embedding = keras.layers.Embedding(vocab_size, units)
        self.encoder = keras.layers.GRU(units, return_state=True)
        self.decoder = keras.layers.GRU(units, return_sequences=True)
        self.softmax = keras.layers.Dense(vocab_size)

    @classmethod
    def validate_hparams(cls, hp):
        if hp.gru_units <= 0:
            raise HParamsError(f"hparam 'gru_units' must be > 0, got {hp.gru_units}.")

    @classmethod
    def from_hparams(cls, hp, vocab_size):
        return cls(vocab_size, hp.gru_units)

    @property
    def vocab_size(self):
        return self._vocab_size

    def call(self, features, training=False):
        inputs, targets = features["inputs"], features["targets"]
        _, state = self.encoder(self.embedding(inputs))
        shifted = tf.pad(targets, [[0, 0], [1, 0]])[:, :-1]
        return self.softmax(self.decoder(self.embedding(shifted), initial_state=state))
"""


@pytest.fixture(scope="module")
def usr_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("usr") / "my_t2t_usr"
    path.mkdir()
    (path / "__init__.py").write_text(textwrap.dedent(USER_PACKAGE))
    return str(path)


def test_cli_trains_and_decodes_a_user_model_problem_and_hparams_set(usr_dir, tmp_path):
    out = str(tmp_path / "run")
    common = [f"--t2t_usr_dir={usr_dir}", f"--output_dir={out}"]
    result = run_cli(
        "trainer",
        *common,
        "--problem=my_copy",
        "--model=my_gru",
        "--hparams_set=my_gru_tiny",
        "--train_steps=60",
        "--save_checkpoints_steps=30",
        "--local_eval_frequency=0",
        "--eval_steps=4",
        "--log_steps=30",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (run["model"], run["problem"]) == ("my_gru", "my_copy")
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(x) for x in lines]
    assert metrics[-1]["global_step"] == 60
    vocab = 8 + 2  # symbols + reserved ids
    assert metrics[-1]["loss"] < math.log(vocab)  # it learned something
    # Decoding needs only the flag: model, problem and hparams come from the run.
    source = tmp_path / "in.txt"
    source.write_text("1 2 3\n\n4 5\n")
    target = tmp_path / "out.txt"
    for beams in (1, 2):
        result = run_cli(
            "decoder",
            *common,
            f"--decode_from_file={source}",
            f"--decode_to_file={target}",
            f"--decode_hparams=beam_size={beams}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        lines = target.read_text().split("\n")[:3]
        assert lines[1] == ""  # an empty line stays empty
        tokens = {t for line in lines for t in line.split()}
        assert tokens and tokens <= {str(i) for i in range(8)}, lines


def test_cli_without_the_usr_dir_names_the_unknown_model(usr_dir, tmp_path):
    import_usr_dir(usr_dir)  # registered in this process already: still refused?
    result = run_cli(
        "trainer",
        f"--output_dir={tmp_path / 'run'}",
        "--problem=algorithmic_reverse",
        "--model=my_gru_typo",
        "--hparams_set=transformer_test",
        "--train_steps=2",
    )
    assert_user_error(result, "t2t-trainer", "Unknown model 'my_gru_typo'", "my_gru")


def test_model_checks_run_only_for_the_model_that_declares_them(usr_dir):
    import_usr_dir(usr_dir)
    hp = registry.HPARAMS_SETS.get("my_gru_tiny")()
    assert validate(hp, "my_gru") is hp  # num_heads 7 does not divide 32: not its key
    with pytest.raises(UserError, match="num_heads"):
        validate(hp, "transformer")
    with pytest.raises(UserError, match="gru_units"):
        validate(hp.copy().override(gru_units=0), "my_gru")


def test_an_hparams_set_without_the_training_keys_is_one_clear_line():
    from t2t_lite.hparams import HParams

    with pytest.raises(UserError, match="start your hparams set from a registered"):
        validate(HParams(hidden_size=8), None)
    assert validate(transformer_test(), None)


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda d: str(d / "missing"), "does not exist"),
        (lambda d: (d / "nopkg").mkdir() or str(d / "nopkg"), "needs an __init__.py"),
        (
            lambda d: (
                (d / "broken").mkdir()
                or (
                    (d / "broken" / "__init__.py").write_text(
                        "x = 1\nraise KeyError('k')\n"
                    )
                    and str(d / "broken")
                )
            ),
            "broken/__init__.py:2",
        ),
        (
            lambda d: (
                (d / "twice").mkdir()
                or (
                    (d / "twice" / "__init__.py").write_text(
                        "from t2t_lite.registry import MODELS\nMODELS.add('transformer', 1)\n"
                    )
                    and str(d / "twice")
                )
            ),
            "registered twice",
        ),
    ],
)
def test_bad_usr_dirs_are_one_line_errors(tmp_path, make, fragment):
    result = run_cli(
        "trainer",
        f"--t2t_usr_dir={make(tmp_path)}",
        f"--output_dir={tmp_path / 'run'}",
        "--train_steps=2",
    )
    assert_user_error(result, "t2t-trainer", "--t2t_usr_dir", fragment)
    assert not os.path.exists(tmp_path / "run")  # nothing was written
