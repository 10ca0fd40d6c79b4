"""Fixtures shared by test files: a small translation model trained once per session."""

import dataclasses

import pytest

from t2t_lite import registrations  # noqa: F401  (registers problems and sets)
from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import TranslateNumbersEnFr
from t2t_lite.registry import HPARAMS_SETS
from t2t_lite.training.trainer import RunConfig, Trainer

NUMBERS_HPARAMS = (
    "optimizer_multistep_accumulate_steps=1,learning_rate_warmup_steps=100"
)


@dataclasses.dataclass
class NumbersRun:
    data_dir: str
    output_dir: str
    record: dict  # the final evaluation


@pytest.fixture(scope="session")
def numbers_run(tmp_path_factory):
    """translate_numbers_en_fr (3000 training pairs, 200 dev) and transformer_tiny
    trained 300 steps with BLEU on 100 dev sentences at steps 150 and 300 (~20 s).
    It reaches BLEU ~98: enough to tell a working decoder from a broken one."""
    root = tmp_path_factory.mktemp("numbers")
    data_dir, output_dir = str(root / "data"), str(root / "run")
    datagen.generate(
        TranslateNumbersEnFr(train_size=3000, dev_size=200),
        data_dir,
        config=datagen.DatagenConfig(num_shards=2),
        log=lambda _: None,
    )
    hp = HPARAMS_SETS.get("transformer_tiny_fake_gpu4")().parse(NUMBERS_HPARAMS)
    config = RunConfig(
        problem="translate_numbers_en_fr",
        model="transformer",
        output_dir=output_dir,
        data_dir=data_dir,
        train_steps=300,
        eval_steps=0,
        local_eval_frequency=150,
        save_checkpoints_steps=150,
        log_steps=150,
        eval_bleu_sentences=100,
    )
    record = Trainer(config, hp).train()
    return NumbersRun(data_dir, output_dir, record)
