"""The small translation model the decoding, export and BLEU tests share
(conftest.py's `numbers_run` trains it once per session)."""

import os

from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import TranslateNumbersEnFr
from t2t_lite.registry import HPARAMS_SETS
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions

TRAIN_STEPS = 300


def train_numbers_model(root):
    """translate_numbers_en_fr (3000 training pairs, 200 dev) and transformer_tiny
    trained TRAIN_STEPS steps, BLEU on 100 dev sentences halfway and at the end,
    under `root` (~20 s on 2 cores; BLEU ~98). Returns (data_dir, output_dir, the
    final evaluation record)."""
    data_dir, output_dir = os.path.join(root, "data"), os.path.join(root, "run")
    datagen.generate(
        TranslateNumbersEnFr(train_size=3000, dev_size=200),
        data_dir,
        config=datagen.DatagenConfig(num_shards=2),
        log=lambda _: None,
    )
    options = TrainerOptions(
        problem="translate_numbers_en_fr",
        model="transformer",
        output_dir=output_dir,
        data_dir=data_dir,
        train_steps=TRAIN_STEPS,
        eval_steps=0,
        local_eval_frequency=TRAIN_STEPS // 2,
        save_checkpoints_steps=TRAIN_STEPS // 2,
        log_steps=TRAIN_STEPS // 2,
        eval_bleu_sentences=100,
    )
    hp = HPARAMS_SETS.get("transformer_tiny_fake_gpu4")().parse(
        "optimizer_multistep_accumulate_steps=1,learning_rate_warmup_steps=100"
    )
    record = Trainer(options, hp).train()
    return data_dir, output_dir, record
