"""Plumbing shared by the scripts in this folder (not part of the t2t_lite package).

Every benchmark here measures RATIOS side by side: the machine is shared, so an
absolute number from another run means little. What they share:

- `environment()` / `load_average()`: the context line every report starts with.
- `hparams()`, `build_seeded_run()`, `build_seeded_model()`: runs and models built the
  trainer's way (`t2t_lite.training.opening.build.build_training`,
  `t2t_lite.models.factory.build_model`), never re-assembled by hand.
- `fixed_batches()`: micro-batches drawn once from a problem's real token-batched
  pipeline, so that every configuration consumes the same data.
- `interleave()` / `median_ratio()`: configurations take turns, in a rotating order,
  so that other load on the machine hits all alike; ratios are taken per round.
- `run_python()` / `last_json()`: a configuration that needs a fresh process (TF op
  determinism, logical devices) runs as a child that prints one JSON line.
- `train_numbers_model()`: the small translation model bench_decoding.py and
  bench_engines.py train (the tests' numbers_run fixture trains the same one,
  tests/support/numbers_model.py).

Scripts import it as `import benchlib` (Python puts the script's folder on sys.path).
"""

import collections
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

from t2t_lite import registrations  # noqa: F401  (registers problems, models, sets)
from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import TranslateNumbersEnFr
from t2t_lite.data.pipeline import batches_from_hparams
from t2t_lite.models.factory import build_model, example_features
from t2t_lite.registry import HPARAMS_SETS, MODELS
from t2t_lite.training.loop.trainer import Trainer, TrainerOptions
from t2t_lite.training.opening.build import build_training


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


# --- context -------------------------------------------------------------------------


def load_average():
    """The 1, 5 and 15 minute load averages, e.g. "1.02 0.87 0.55"."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_start():
    """The first line of a benchmark: the load it starts under."""
    print(
        f"load average at start: {load_average()} (other processes skew the numbers)",
        flush=True,
    )


def environment():
    """CPU count, TF and Keras versions and the load: the line before a table."""
    return (
        f"{os.cpu_count()} CPU cores, TF {tf.__version__}, Keras {keras.__version__}, "
        f"load average {load_average()}"
    )


# --- building, the trainer's way ------------------------------------------------------


def hparams(hparams_set, overrides="", **values):
    """The registered set `hparams_set`, with "a=1,b=2" `overrides`, then `values`."""
    return HPARAMS_SETS.get(hparams_set)().parse(overrides).override(**values)


def build_seeded_run(hp, vocab_size, train_steps, seed, strategy=None):
    """`build_training` (model, schedule, optimizer, TrainStep) after seeding everything,
    so two configurations built with the same seed start from the same weights."""
    keras.utils.set_random_seed(seed)
    return build_training(
        hp, vocab_size=vocab_size, train_steps=train_steps, strategy=strategy
    )


def build_seeded_model(hp, vocab_size, seed, model="transformer"):
    """A registered model with its variables created (`build_model`), seeded."""
    keras.utils.set_random_seed(seed)
    return build_model(MODELS.get(model), hp, vocab_size)


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


# --- side by side ----------------------------------------------------------------------


def interleave(configs, rounds, run_one, label=""):
    """Calls run_one(config, round) for every config, `rounds` times; each round
    starts one config later than the last, so that no config always follows the same
    one and other load on the machine hits all alike. Prints progress if `label`."""
    configs = list(configs)
    for round_index in range(rounds):
        k = round_index % len(configs)
        for config in configs[k:] + configs[:k]:
            run_one(config, round_index)
        if label:
            print(f"{label}: round {round_index + 1}/{rounds} done", flush=True)


def median_ratio(values, baseline):
    """Median over rounds of values[i] / baseline[i] (both measured in round i)."""
    return statistics.median(v / b for v, b in zip(values, baseline))


def spread(values):
    """(max - min) / median of a list of measurements, in percent."""
    return 100 * (max(values) - min(values)) / statistics.median(values)


# --- the TF profiler -------------------------------------------------------------------


def op_type_stats(run_steps, steps):
    """{op type: self seconds per step} while `run_steps()` runs `steps` steps under
    the TF profiler, or None if this TF has no xspace converter (it is TF's internal
    one: the TensorBoard profile plugin is not installed). Warm up before calling."""
    try:
        from tensorflow.python.profiler.internal import (
            _pywrap_profiler_plugin as plugin,
        )
    except ImportError:
        return None
    logdir = tempfile.mkdtemp(prefix="t2t_tfprof_")
    try:
        tf.profiler.experimental.start(logdir)
        run_steps()
        tf.profiler.experimental.stop()
        paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        data, _ = plugin.xspace_to_tools_data(paths, "framework_op_stats", {})
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    table = json.loads(data)[0]
    ids = [c["id"] for c in table["cols"]]
    totals = collections.Counter()
    for row in table["rows"]:
        cells = dict(zip(ids, [c.get("v") if c else None for c in row["c"]]))
        totals[cells["type"]] += cells["total_self_time"] * 1e-6 / steps
    return totals


# --- child processes -----------------------------------------------------------------


def run_python(args, env=None):
    """Runs `python args...` to the end; returns (stdout, stderr). A failure raises
    with the end of the child's stderr."""
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode:
        raise RuntimeError(
            f"{' '.join(args)} exited with {result.returncode}:\n"
            + "\n".join(result.stderr.splitlines()[-20:])
        )
    return result.stdout, result.stderr


def last_json(stdout):
    """The last line of a child's stdout, parsed as JSON."""
    return json.loads(stdout.strip().splitlines()[-1])


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
    config = TrainerOptions(
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
    record = Trainer(config, hp).train()
    return data_dir, output_dir, record
