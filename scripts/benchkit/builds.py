"""Runs, models and data built the trainer's way, for the benchmarks in scripts/.

- `hparams()`, `build_seeded_parts()`, `build_seeded_model()`: training parts and
  models built as the trainer builds them (`t2t_lite.training.opening.build.build_training`,
  `t2t_lite.models.factory.build_model`), never re-assembled by hand, and seeded, so
  that two configurations built with the same seed start from the same weights.
- `micro_step()`: one micro-step driven as the loop drives it.
- `fixed_batches()`: micro-batches drawn once from a problem's real token-batched
  pipeline, so that every configuration consumes the same data.
- `train_numbers_model()`: the small translation model bench_decoding.py,
  bench_engines.py and bench_precision.py train (the tests' numbers_run fixture
  trains the same one, tests/support/numbers_model.py).
"""

import os

import keras
import numpy as np
import tensorflow as tf

from t2t_lite import registrations  # noqa: F401  (registers problems, models, sets)
from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import TranslateNumbersEnFr
from t2t_lite.data.pipeline import batches_from_hparams
from t2t_lite.models.factory import build_model, example_features
from t2t_lite.registry import HPARAMS_SETS, MODELS

try:
    from t2t_lite.training.loop.trainer import Trainer, TrainerOptions
    from t2t_lite.training.opening.build import build_training
except ImportError:
    # A copy of the package from before the run-related renames, which
    # bench_step.py --packages measures side by side with the current one.
    from t2t_lite.training.loop.trainer import RunConfig as TrainerOptions
    from t2t_lite.training.loop.trainer import Trainer
    from t2t_lite.training.opening.build import build_run as build_training


def batch_signature():
    """The train step's input signature: every feature a [batch, length] matrix of
    the model's example features' dtype. (A function: importing this module must run
    no TF op, so that a script can still split the CPU into logical devices.)"""
    return (
        {
            key: tf.TensorSpec([None, None], value.dtype)
            for key, value in example_features().items()
        },
    )


# --- building, the trainer's way ------------------------------------------------------


def hparams(hparams_set, overrides="", **values):
    """The registered set `hparams_set`, with "a=1,b=2" `overrides`, then `values`."""
    return HPARAMS_SETS.get(hparams_set)().parse(overrides).override(**values)


def build_seeded_parts(hp, vocab_size, train_steps, seed, **options):
    """`build_training`'s TrainingParts (model, schedule, optimizer, TrainStep) after
    seeding everything, so two configurations built with the same seed start from
    the same weights. `options` go to build_training (strategy, jit_compile)."""
    keras.utils.set_random_seed(seed)
    return build_training(hp, vocab_size=vocab_size, train_steps=train_steps, **options)


def build_seeded_model(hp, vocab_size, seed, model="transformer"):
    """A registered model with its variables created (`build_model`), seeded."""
    keras.utils.set_random_seed(seed)
    return build_model(MODELS.get(model), hp, vocab_size)


def micro_step(step, batch, i):
    """Micro-step `i` of a fixed plan on `batch`, as the loop drives it: its outputs."""
    return step.train_on(batch, step.is_update_micro_step(i))


# --- data ----------------------------------------------------------------------------


def non_pad_tokens(batch):
    """Non-pad target tokens of a batch (numpy or tensors)."""
    return int(np.count_nonzero(np.asarray(batch["targets"])))


def problem_batches(problem, hp, seed, replica=0, num_replicas=1, data_dir=None):
    """The training batches of `problem` as the trainer makes them (token buckets of
    hp.batch_size tokens, shuffled with `seed`, repeated), for one replica's shard."""
    return batches_from_hparams(
        problem,
        hp,
        "train",
        data_dir=data_dir,
        training=True,
        seed=seed,
        replica=replica,
        num_replicas=num_replicas,
    )


def fixed_batches(problem, hp, count, seed):
    """(batches, tokens): the first `count` training micro-batches of `problem` as
    int32 tensors in memory, and their non-pad target token counts."""
    batches = [
        {k: tf.constant(v.numpy()) for k, v in batch.items()}
        for batch in problem_batches(problem, hp, seed).take(count)
    ]
    return batches, [non_pad_tokens(b) for b in batches]


# --- the numbers translation model ------------------------------------------------------

NUMBERS_HPARAMS_SET = "transformer_tiny_fake_gpu4"
NUMBERS_HPARAMS = (
    "optimizer_multistep_accumulate_steps=1,learning_rate_warmup_steps=100"
)


def train_numbers_model(root, overrides="", train_steps=300):
    """translate_numbers_en_fr (3000 training pairs, 200 dev) and transformer_tiny
    trained `train_steps` (300) steps with BLEU on 100 dev sentences halfway and at
    the end, under
    `root` (~20 s on 2 cores; BLEU ~98). Returns (data_dir, output_dir, the final
    evaluation record)."""
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
        train_steps=train_steps,
        eval_steps=0,
        local_eval_frequency=train_steps // 2,
        save_checkpoints_steps=train_steps // 2,
        log_steps=train_steps // 2,
        eval_bleu_sentences=100,
    )
    hp = hparams(
        NUMBERS_HPARAMS_SET, ",".join(filter(None, [NUMBERS_HPARAMS, overrides]))
    )
    record = Trainer(options, hp).train()
    return data_dir, output_dir, record
