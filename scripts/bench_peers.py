"""Benchmark: t2t_lite's training throughput against the frameworks a user would pick
instead, side by side in one run, on the same data and the same architecture.

Configurations (--configs, all by default):

  t2t_f32     t2t_lite TrainStep (build_training, the trainer's own assembly), float32.
  t2t_bf16    the same with hparam activation_dtype=bfloat16 (mixed precision).
  t2t_xla     the same, float32, with build_training(jit_compile=True) (XLA) and the
              batches padded to their length bucket (pipeline's pad_to_bucket), as
              `t2t-trainer --xla` trains; reported as unavailable when build_training has
              no jit_compile keyword.
  keras_f32   what a Keras 3 user writes: keras_hub.layers.TransformerEncoder /
              TransformerDecoder + TokenAndPositionEmbedding (tied softmax), model.fit
              with keras.optimizers.Adam(gradient_accumulation_steps=n), float32.
  keras_bf16  the same under keras.mixed_precision policy "mixed_bfloat16".
  opennmt_f32 OpenNMT-tf 2.32 (TensorFlow 2.12, in its own virtual environment, see
              --setup_opennmt) driven through its own `onmt-main train`, with a model
              file defining opennmt.models.Transformer of the same sizes.

The same for all: encoder and decoder layers of --hidden_size (--num_layers each),
--filter_size, --num_heads, dropout --dropout everywhere, label smoothing, one shared
vocabulary of --vocab_size ids (shared embeddings and softmax), micro-batches of
--batch_size tokens (padding included, token-bucketed) and --accumulate_steps
micro-batches per optimizer update (default 2048 x 4 = 8192 tokens per update).

The same data for all: a synthetic parallel corpus of --corpus_sentences pairs
(lognormal sentence lengths, mean --mean_length, clipped to 1..--max_length, target
length correlated with the source, Zipf-distributed token ids). t2t_lite's own token
bucketing (data/pipeline.py via benchlib.fixed_batches) turns its shuffled stream into
--updates x n micro-batches; t2t_lite and Keras train on exactly these batches, and
OpenNMT-tf reads the whole corpus from text files ("w17 w5 ...", a plain vocabulary
file) and batches it its own way (batch_type tokens, length_bucket_width 1,
effective_batch_size = tokens per update). The corpus is large on purpose: OpenNMT
flushes its half-filled length buckets at every epoch end, which on a corpus of only
the sentences of those few micro-batches would make every OpenNMT batch half empty.

What differs, besides the frameworks (by design: each does what its users get):
  - Keras: learned position embeddings (keras-hub), no sqrt(hidden) embedding scale,
    biases in attention projections, Keras's loss reduction (a mean over all positions
    of each micro-batch, padding weighted 0; updates average the n micro-batch means,
    not token-exact, docs/design.md §2), label smoothing over all ids, decoder input starts
    with id 1. jit_compile="auto" (Keras's default) means no XLA on a CPU-only machine.
  - OpenNMT-tf: its own input pipeline (reads and tokenizes text in tf.data threads,
    running beside the training step), its own buckets; vocabulary + <blank>, <s>,
    </s>, <unk>; biases in attention projections; Adam (not LazyAdam), Noam schedule;
    float32 only (its --mixed_precision is float16 and refuses to run without an
    NVIDIA GPU).
  - t2t_lite and Keras get in-memory batches: their input pipelines are not measured.

Method: t2t_lite and Keras configs each live in a worker process of their own (no
state leaks between them, e.g. Keras's global mixed-precision policy), started
together; each builds its model and warms up with one untimed update (tracing;
t2t_xla: one untimed pass over all the batches, as XLA compiles once per batch
shape; the compile times show as "warmup s"). Then --rounds rounds,
in which every configuration in turn (benchlib.interleave: rotating order) trains
--updates updates on the same batches: tokens/s = non-pad target tokens (EOS
included) / wall time. OpenNMT-tf runs once per round in its venv's python: a fresh
`onmt-main train` of --opennmt_warmup + --updates updates, logging every update; its
tokens/s is the "target" tokens/s it logs, weighted by the log timestamps, over the
updates after the warmup ones. Reported: medians over rounds, ratios (median of
per-round ratios) of every t2t_lite config to every peer, and model FLOPs utilization
(`training_flops`) against this machine's tf.matmul peak (2048x2048, float32 and
bfloat16, best of several, measured before and after the rounds): float32 configs
against the float32 peak, bfloat16 ones against the bfloat16 peak.

Run (from the repository root):

  python scripts/bench_peers.py --setup_opennmt   # once: OpenNMT-tf venv (network)
  python scripts/bench_peers.py                   # ~14 min on 2 quiet cores
  python scripts/bench_peers.py --smoke           # tiny model, every config, ~1 min

On a loaded machine everything takes longer (the XLA warmup most: it compiles every
batch shape) and the spread grows; the load average is printed at start and end.

The last line printed is a JSON summary (tests/test_bench_peers.py reads it).
"""

import argparse
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from opennmt_driver import (  # scripts/opennmt_driver.py: shared with opennmt_recipe
    DEFAULT_VENV,
    OPENNMT_MODEL,
    STEP_LINE,
    log_time,
    opennmt_env,
    opennmt_main,
    setup_opennmt,
    yaml_text,
)

ALL_CONFIGS = (
    "t2t_f32",
    "t2t_bf16",
    "t2t_xla",
    "keras_f32",
    "keras_bf16",
    "opennmt_f32",
)
PEERS = ("keras_f32", "keras_bf16", "opennmt_f32")
DTYPES = {name: ("bfloat16" if "bf16" in name else "float32") for name in ALL_CONFIGS}
MARK = "@@bench_peers "  # prefixes a worker's protocol lines on its stdout
SMOKE = {  # --smoke: a tiny model, one round of one update (two micro-batches)
    "hidden_size": 32,
    "filter_size": 64,
    "num_layers": 1,
    "num_heads": 2,
    "vocab_size": 200,
    "batch_size": 256,
    "accumulate_steps": 2,
    "updates": 1,
    "rounds": 1,
    "mean_length": 8,
    "max_length": 16,
    "corpus_sentences": 500,
}
METHODS = {  # how tokens/s is measured
    "in_process": "non-pad target tokens (EOS included) / wall time of --updates "
    "updates on in-memory batches, after warmup",
    "opennmt": "target tokens/s logged by onmt-main every update, weighted by the "
    "log timestamps, after --opennmt_warmup updates",
}

# --- arguments -----------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--smoke", action="store_true", help="Tiny model, 1 round: seconds.")
    add("--setup_opennmt", action="store_true", help="Create the OpenNMT venv, exit.")
    add("--venv", default=DEFAULT_VENV, help="OpenNMT-tf virtual environment.")
    add("--configs", default=",".join(ALL_CONFIGS), help="Comma-separated subset.")
    add("--rounds", type=int, default=3, help="Interleaved rounds (medians).")
    add("--updates", type=int, default=5, help="Timed updates per config per round.")
    add("--opennmt_warmup", type=int, default=2, help="Untimed OpenNMT updates (>=2).")
    add("--accumulate_steps", type=int, default=4, help="Micro-batches per update.")
    add("--batch_size", type=int, default=2048, help="Tokens per micro-batch.")
    add("--hidden_size", type=int, default=256)
    add("--filter_size", type=int, default=1024)
    add("--num_layers", type=int, default=3, help="Encoder and decoder layers each.")
    add("--num_heads", type=int, default=4)
    add("--vocab_size", type=int, default=8000, help="Shared vocabulary (ids).")
    add("--dropout", type=float, default=0.1)
    add("--label_smoothing", type=float, default=0.1)
    add("--mean_length", type=float, default=25.0, help="Mean sentence length.")
    add("--max_length", type=int, default=100, help="Longest sentence (tokens).")
    add("--corpus_sentences", type=int, default=50000, help="Synthetic corpus size.")
    add("--seed", type=int, default=1)
    add("--work_dir", default="", help="Data, configs and logs; default: a temp dir.")
    add("--worker", default="", help=argparse.SUPPRESS)  # internal: child mode
    add("--spec", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in ALL_CONFIGS]
    if unknown or not args.configs:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(ALL_CONFIGS)}.")
    if args.accumulate_steps < 2 or args.opennmt_warmup < 2 or args.updates < 1:
        p.error(
            "need --accumulate_steps >= 2 (Keras refuses less), "
            "--opennmt_warmup >= 2 (OpenNMT ignores 2), --updates >= 1."
        )
    return args


def model_spec(args, work_dir):
    """What every worker needs to build its configuration, as a JSON-able dict."""
    keys = (
        "corpus_sentences",
        "hidden_size",
        "filter_size",
        "num_layers",
        "num_heads",
        "vocab_size",
        "dropout",
        "label_smoothing",
        "batch_size",
        "accumulate_steps",
        "seed",
    )
    spec = {k: getattr(args, k) for k in keys}
    spec["max_tokens"] = args.max_length + 1  # a sentence + EOS
    spec["batches_path"] = os.path.join(work_dir, "batches.npz")
    spec["xla_batches_path"] = os.path.join(work_dir, "batches_xla.npz")
    return spec


# --- data ----------------------------------------------------------------------------


def synthetic_pairs(count, vocab_size, mean_length, max_length, seed):
    """`count` (source, target) id arrays ending in EOS (id 1): lognormal lengths
    (sigma 0.6, mean `mean_length`, clipped to 1..max_length; the target's length is
    the source's times lognormal(0, 0.15), like a translation's), ids 2..vocab-1 drawn
    from a Zipf (1/rank) distribution, as words in text are."""
    rng = np.random.default_rng(seed)
    sigma = 0.6
    src = rng.lognormal(np.log(mean_length) - sigma**2 / 2, sigma, count)
    tgt = src * rng.lognormal(0.0, 0.15, count)
    lengths = [np.clip(np.rint(x), 1, max_length).astype(int) for x in (src, tgt)]
    weights = 1.0 / np.arange(1, vocab_size - 1)
    ids = (
        rng.choice(
            vocab_size - 2,
            lengths[0].sum() + lengths[1].sum(),
            p=weights / weights.sum(),
        )
        + 2
    )
    pieces = np.split(ids, np.cumsum(np.concatenate(lengths))[:-1])
    sequences = [np.append(p, 1).astype(np.int32) for p in pieces]
    return list(zip(sequences[:count], sequences[count:]))


class SyntheticProblem:
    """A stand-in for a registered problem: benchlib.fixed_batches (t2t_lite's own
    token bucketing) only asks it for `replica_dataset`."""

    def __init__(self, pairs):
        self.pairs = pairs

    def replica_dataset(self, split, data_dir, replica, num_replicas):
        import tensorflow as tf

        spec = tf.TensorSpec([None], tf.int32)
        return tf.data.Dataset.from_generator(
            lambda: ({"inputs": s, "targets": t} for s, t in self.pairs),
            output_signature={"inputs": spec, "targets": spec},
        )


def make_batches(args, spec, pairs):
    """The --updates x n micro-batches t2t_lite and Keras train on, from the shuffled
    stream of `pairs` (saved for the workers)."""
    import benchlib

    count = args.updates * args.accumulate_steps
    hp = benchlib.hparams(
        "transformer_base",
        "",
        batch_size=args.batch_size,
        max_length=spec["max_tokens"],
    )
    batches, _ = benchlib.fixed_batches(SyntheticProblem(pairs), hp, count, args.seed)
    batches = [{k: v.numpy() for k, v in b.items()} for b in batches]
    save_batches(spec["batches_path"], batches)
    save_batches(spec["xla_batches_path"], xla_batches(pairs, hp, count, args.seed))
    return batches


def xla_batches(pairs, hp, count, seed):
    """The same micro-batches padded to their length bucket, as the trainer feeds
    them under --xla (XLA compiles once per shape): the pipeline's pad_to_bucket,
    same seed, so the same sentences in the same batches."""
    from t2t_lite.data.pipeline import batches_from_hparams

    if "pad_to_bucket" not in inspect.signature(batches_from_hparams).parameters:
        return []  # not there yet: t2t_xla then trains on the unpadded batches
    dataset = batches_from_hparams(
        SyntheticProblem(pairs),
        hp,
        "train",
        training=True,
        seed=seed,
        pad_to_bucket=True,
    )
    return [{k: v.numpy() for k, v in b.items()} for b in dataset.take(count)]


def save_batches(path, batches):
    np.savez(path, **{f"{k}_{i}": b[k] for i, b in enumerate(batches) for k in b})


def load_batches(path):
    """The micro-batches make_batches saved, as a list of {"inputs", "targets"}."""
    data = np.load(path)
    count = len(data.files) // 2
    return [{k: data[f"{k}_{i}"] for k in ("inputs", "targets")} for i in range(count)]


def target_tokens(batches):
    return int(sum(np.count_nonzero(b["targets"]) for b in batches))


def write_text_corpus(pairs, vocab_size, directory):
    """The sentence pairs as OpenNMT reads them: one sentence per line, tokens
    "w<id>" (without the EOS: OpenNMT adds its own </s>), and a vocabulary file
    starting with OpenNMT's <blank>, <s>, </s>."""
    os.makedirs(directory, exist_ok=True)
    paths = {k: os.path.join(directory, f"train.{k}") for k in ("src", "tgt", "vocab")}
    lines = {
        key: [" ".join(f"w{i}" for i in pair[side][:-1]) for pair in pairs]
        for key, side in (("src", 0), ("tgt", 1))
    }
    lines["vocab"] = ["<blank>", "<s>", "</s>"] + [
        f"w{i}" for i in range(2, vocab_size)
    ]
    for key, path in paths.items():
        with open(path, "w") as f:
            f.write("\n".join(lines[key]) + "\n")
    return paths


# --- FLOPs and the machine's peak ------------------------------------------------------


def training_flops(batches, spec):
    """(training FLOPs of one pass over `batches`, their non-pad target tokens).

    Matmul FLOPs only (2 per multiply-add), forward x 3 for forward + backward, over
    non-pad tokens (padding is waste, not model FLOPs); layer norms, softmaxes and
    embedding lookups are left out. d = hidden, f = filter, V = vocab, L = layers;
    per sentence pair of source length s and target length t (EOS included):

      forward = s * L * (8 d^2 + 4 d f)          encoder: q, k, v, o + feed-forward
              + s * L * 4 d^2                     decoder cross-attention k, v
              + t * L * (12 d^2 + 4 d f)          decoder: self q, k, v, o, cross q, o,
                                                  feed-forward
              + t * 2 d V                         softmax (shared embedding matrix)
              + 4 d L (s^2 + t^2 + s t)           attention scores and weighted sums
                                                  (self: full square, as computed)
      training = 3 * forward

    With s = t this is 6 x (non-embedding parameters + d V) per token plus the
    attention terms: the usual "6N" estimate.
    """
    d, f, v, n = (
        spec[k] for k in ("hidden_size", "filter_size", "vocab_size", "num_layers")
    )
    total = 0.0
    for batch in batches:
        s = np.count_nonzero(batch["inputs"], axis=1).astype(np.float64)
        t = np.count_nonzero(batch["targets"], axis=1).astype(np.float64)
        forward = (
            s.sum() * n * (12 * d * d + 4 * d * f)
            + t.sum() * (n * (12 * d * d + 4 * d * f) + 2 * d * v)
            + 4 * d * n * (s * s + t * t + s * t).sum()
        )
        total += 3 * forward
    return total, target_tokens(batches)


def matmul_peak(dtype_name, size=2048, repeats=5):
    """FLOP/s of the best of `repeats` tf.matmul of two size x size matrices."""
    import tensorflow as tf

    dtype = tf.as_dtype(dtype_name)
    a = tf.cast(tf.random.normal([size, size]), dtype)
    b = tf.cast(tf.random.normal([size, size]), dtype)
    float(tf.reduce_sum(tf.matmul(a, b)[0, :1]))  # warmup: oneDNN builds its kernel
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        float(tf.matmul(a, b)[0, 0])
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def measure_peaks(peaks=None):
    """Both peaks, keeping the better of this and an earlier measurement."""
    peaks = dict(peaks or {})
    for dtype in ("float32", "bfloat16"):
        peaks[dtype] = max(peaks.get(dtype, 0.0), matmul_peak(dtype))
    return peaks


# --- worker side: t2t_lite and Keras configurations --------------------------------------


def t2t_hparams(spec, activation_dtype):
    """transformer_base with the benchmark's sizes, dropout, batching and n."""
    import benchlib

    return benchlib.hparams(
        "transformer_base",
        "",
        hidden_size=spec["hidden_size"],
        filter_size=spec["filter_size"],
        num_hidden_layers=spec["num_layers"],
        num_heads=spec["num_heads"],
        layer_prepostprocess_dropout=spec["dropout"],
        attention_dropout=spec["dropout"],
        relu_dropout=spec["dropout"],
        label_smoothing=spec["label_smoothing"],
        batch_size=spec["batch_size"],
        max_length=spec["max_tokens"],
        optimizer_multistep_accumulate_steps=spec["accumulate_steps"],
        activation_dtype=activation_dtype,
    )


class T2TSession:
    """A t2t_lite configuration, built the trainer's way (build_training)."""

    def __init__(self, name, spec, batches):
        import benchlib
        import keras
        import tensorflow as tf

        from t2t_lite.training.opening.build import build_training

        hp = t2t_hparams(spec, DTYPES[name])
        if name == "t2t_xla":
            if "jit_compile" not in inspect.signature(build_training).parameters:
                raise RuntimeError(
                    "unavailable: build_training has no jit_compile keyword"
                )
            keras.utils.set_random_seed(spec["seed"])
            run = build_training(
                hp, vocab_size=spec["vocab_size"], train_steps=100000, jit_compile=True
            )
        else:
            run = benchlib.build_seeded_run(
                hp, spec["vocab_size"], 100000, spec["seed"]
            )
        self.step, self.micro_step = run.step, 0
        self.params = int(sum(np.prod(v.shape) for v in run.model.trainable_variables))
        self.batches = [{k: tf.constant(v) for k, v in b.items()} for b in batches]
        self.tokens = [target_tokens([b]) for b in batches]
        self.n = spec["accumulate_steps"]
        # XLA compiles once per batch shape: warm up on every batch, not one update.
        self.warmup_batches = None if name == "t2t_xla" else spec["accumulate_steps"]

    def segment(self, count=None):
        """Trains on the first `count` batches (default all: a whole number of
        updates), timed."""
        import tensorflow as tf

        start = time.perf_counter()
        for batch in self.batches[:count]:
            out = self.step.train_on(
                batch, self.step.is_update_micro_step(self.micro_step)
            )
            self.micro_step += 1
        float(tf.nest.flatten(out)[0])  # on CPU a call returns when done; to be sure
        seconds = time.perf_counter() - start
        tokens = self.tokens[:count]
        updates = len(tokens) // self.n
        return {"tokens": sum(tokens), "seconds": seconds, "updates": updates}


def keras_transformer(spec):
    """The encoder-decoder a Keras user assembles from keras-hub layers: shared token
    + learned position embedding, pre-norm layers, final norms, tied softmax."""
    import keras
    import keras_hub

    d, dropout = spec["hidden_size"], spec["dropout"]
    layer_args = {
        "intermediate_dim": spec["filter_size"],
        "num_heads": spec["num_heads"],
        "dropout": dropout,
        "normalize_first": True,  # pre-norm, as t2t_lite and OpenNMT-tf
        "layer_norm_epsilon": 1e-6,
    }
    embed = keras_hub.layers.TokenAndPositionEmbedding(
        spec["vocab_size"], spec["max_tokens"] + 1, d, tie_weights=True
    )
    source = keras.Input((None,), dtype="int32", name="source")
    target_in = keras.Input((None,), dtype="int32", name="target_in")
    source_mask = keras.ops.not_equal(source, 0)
    x = keras.layers.Dropout(dropout)(embed(source))  # [batch, source_len, hidden]
    for _ in range(spec["num_layers"]):
        x = keras_hub.layers.TransformerEncoder(**layer_args)(
            x, padding_mask=source_mask
        )
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x)
    y = keras.layers.Dropout(dropout)(embed(target_in))  # [batch, target_len, hidden]
    for _ in range(spec["num_layers"]):
        y = keras_hub.layers.TransformerDecoder(**layer_args)(
            y,
            x,
            decoder_padding_mask=keras.ops.not_equal(target_in, 0),
            encoder_padding_mask=source_mask,
        )
    y = keras.layers.LayerNormalization(epsilon=1e-6)(y)
    logits = embed.token_embedding(y, reverse=True)  # [batch, target_len, vocab]
    return keras.Model([source, target_in], logits)


def keras_examples(batches):
    """((source, decoder input), labels, weights) numpy tuples from t2t_lite batches:
    the decoder input is the target shifted right after a start id 1 (so it is
    non-zero exactly where the labels are), weights mask the padding."""
    examples = []
    for b in batches:
        targets = b["targets"]
        target_in = np.concatenate([np.ones_like(targets[:, :1]), targets[:, :-1]], 1)
        target_in[targets == 0] = 0
        weights = (targets != 0).astype(np.float32)
        examples.append(((b["inputs"], target_in), targets, weights))
    return examples


class KerasSession:
    """A keras-hub Transformer trained with model.fit, as a Keras user would."""

    def __init__(self, name, spec, batches):
        import benchlib
        import keras
        import tensorflow as tf

        from t2t_lite.optim.batch_plan import plan_from_hparams
        from t2t_lite.optim.schedule import schedule_from_hparams

        if name == "keras_bf16":
            keras.mixed_precision.set_global_policy("mixed_bfloat16")
        keras.utils.set_random_seed(spec["seed"])
        self.model = keras_transformer(spec)
        hp = benchlib.hparams("transformer_base", "", hidden_size=spec["hidden_size"])
        optimizer = keras.optimizers.Adam(  # same Adam values and schedule as t2t_lite
            learning_rate=schedule_from_hparams(hp, 100000, plan_from_hparams(hp)),
            beta_1=0.9,
            beta_2=0.997,
            epsilon=1e-9,
            gradient_accumulation_steps=spec["accumulate_steps"],
        )
        vocab, smoothing = spec["vocab_size"], spec["label_smoothing"]

        def loss(labels, logits):
            labels = keras.ops.one_hot(keras.ops.cast(labels, "int32"), vocab)
            return keras.losses.categorical_crossentropy(
                labels, logits, from_logits=True, label_smoothing=smoothing
            )

        self.model.compile(optimizer=optimizer, loss=loss)  # jit_compile="auto"
        examples = keras_examples(batches)

        def spec_of(array):
            return tf.TensorSpec([None, None], tf.as_dtype(array.dtype))

        self.data = tf.data.Dataset.from_generator(
            lambda: iter(examples),
            output_signature=tf.nest.map_structure(spec_of, examples[0]),
        ).prefetch(2)
        self.steps, self.tokens = len(examples), [target_tokens([b]) for b in batches]
        self.n = spec["accumulate_steps"]
        self.params = int(self.model.count_params())
        self.warmup_batches = spec["accumulate_steps"]  # traces fit's step once

    def segment(self, count=None):
        """One model.fit epoch over the first `count` batches (default all), timed
        from the first batch's start to the last one's end (not fit's own setup)."""
        import keras

        times = []

        def begin(batch, logs):
            if batch == 0:
                times.append(time.perf_counter())

        def end(batch, logs):
            times.append(time.perf_counter())

        timer = keras.callbacks.LambdaCallback(
            on_train_batch_begin=begin, on_train_batch_end=end
        )
        self.model.fit(
            self.data,
            epochs=1,
            steps_per_epoch=count or self.steps,
            verbose=0,
            callbacks=[timer],
        )
        seconds = times[-1] - times[0]
        tokens = self.tokens[:count]
        updates = len(tokens) // self.n
        return {"tokens": sum(tokens), "seconds": seconds, "updates": updates}


def reply(message):
    print(MARK + json.dumps(message), flush=True)


def error_line(exc):
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {lines[0]}"[:300]


def worker_main(name, spec_path):
    """Child mode: build `name`, warm up (one update: tracing; XLA: one pass, every
    shape compiled), say ready, then time one pass over the batches per "run" line
    on stdin until "quit" (or the end of stdin)."""
    with open(spec_path) as f:
        spec = json.load(f)
    session_class = KerasSession if name.startswith("keras") else T2TSession
    try:
        start = time.perf_counter()
        path = spec["xla_batches_path" if name == "t2t_xla" else "batches_path"]
        batches = load_batches(path) or load_batches(spec["batches_path"])
        session = session_class(name, spec, batches)
        session.segment(session.warmup_batches)
        reply(
            {
                "ready": True,
                "warmup_seconds": time.perf_counter() - start,
                "params": session.params,
            }
        )
    except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
        reply({"error": error_line(exc)})
        return
    for line in sys.stdin:
        if line.strip() != "run":
            break
        try:
            reply(session.segment())
        except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
            reply({"error": error_line(exc)})
            return


# --- parent side: workers ---------------------------------------------------------------


class Worker:
    """The parent's handle on one worker process (line protocol over its stdin and
    stdout; its stderr, TF's logs included, goes to a file)."""

    def __init__(self, name, spec_path, log_path):
        self.name, self.log_path = name, log_path
        with open(log_path, "w") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    f"--worker={name}",
                    f"--spec={spec_path}",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def receive(self):
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.proc.wait()
        with open(self.log_path) as f:
            tail = " | ".join(f.read().strip().splitlines()[-3:])
        return {"error": f"worker exited with {self.proc.returncode}: {tail}"[:400]}

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.receive()

    def close(self):
        """Asks the worker to quit and waits for it (no zombie left behind)."""
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):  # it has already exited
            pass
        self.proc.wait(timeout=60)


def start_workers(names, spec_path, work_dir, results):
    """Starts a worker per in-process config, all at once, and waits until each is
    warmed up (or failed: its status becomes "error")."""
    workers = {
        n: Worker(n, spec_path, os.path.join(work_dir, f"worker-{n}.log"))
        for n in names
    }
    for name, worker in workers.items():
        message = worker.receive()
        if "error" in message:
            results[name].fail(message["error"])
            worker.close()
        else:
            results[name].params = message["params"]
            results[name].warmup_seconds = message["warmup_seconds"]
        print(f"{name}: {message}", flush=True)
    return {n: w for n, w in workers.items() if results[n].status == "measured"}


# --- OpenNMT-tf ----------------------------------------------------------------------


def opennmt_config(spec, paths, model_dir, max_step):
    """onmt-main's YAML config (written as JSON, which YAML reads)."""
    return {
        "model_dir": model_dir,
        "data": {
            "train_features_file": paths["src"],
            "train_labels_file": paths["tgt"],
            "source_vocabulary": paths["vocab"],
            "target_vocabulary": paths["vocab"],
        },
        "params": {
            "optimizer": "Adam",
            "optimizer_params": {"beta_1": 0.9, "beta_2": 0.997, "epsilon": 1e-9},
            "learning_rate": 2.0,
            "decay_type": "NoamDecay",
            "decay_params": {"model_dim": spec["hidden_size"], "warmup_steps": 8000},
            "label_smoothing": spec["label_smoothing"],
            "average_loss_in_time": True,
        },
        "train": {
            "batch_type": "tokens",
            "batch_size": spec["batch_size"],
            "effective_batch_size": spec["batch_size"] * spec["accumulate_steps"],
            "length_bucket_width": 1,
            "maximum_features_length": spec["max_tokens"],
            "maximum_labels_length": spec["max_tokens"],
            "max_step": max_step,
            "save_summary_steps": 1,
            "save_checkpoints_steps": 10**7,
            "keep_checkpoint_max": 1,
        },
    }


def parse_opennmt_log(text, warmup):
    """{"tokens", "seconds", "params"} of the updates after `warmup`, from onmt-main's
    per-update lines ("Step = k ; ... tokens/s = ... (S source, T target)"): T is the
    target tokens/s of update k alone, so update k trained T x (time of line k - time
    of line k-1) target tokens."""
    times, rates = {}, {}
    for line in text.splitlines():
        match = STEP_LINE.search(line)
        if match:
            stamp = log_time(match[1])
            times[int(match[2])], rates[int(match[2])] = stamp, int(match[3])
    timed = [k for k in sorted(times) if k > warmup and k - 1 in times]
    if not timed:
        raise RuntimeError("no per-update 'Step = ...' lines after warmup in its log")
    seconds = [(times[k] - times[k - 1]).total_seconds() for k in timed]
    params = re.search(r"Number of model parameters: (\d+)", text)
    return {
        "tokens": sum(rates[k] * s for k, s in zip(timed, seconds)),
        "seconds": sum(seconds),
        "updates": len(timed),
        "params": int(params[1]) if params else None,
    }


def run_opennmt(spec, paths, args, round_index):
    """One fresh `onmt-main train` of warmup + updates updates; its timed part."""
    run_dir = os.path.join(args.work_dir, "opennmt", f"round{round_index}")
    os.makedirs(run_dir, exist_ok=True)
    model_path = os.path.join(run_dir, "transformer_model.py")
    with open(model_path, "w") as f:
        f.write(OPENNMT_MODEL.format(**spec))
    config_path = os.path.join(run_dir, "config.yml")
    max_step = args.opennmt_warmup + args.updates
    config = opennmt_config(spec, paths, os.path.join(run_dir, "model"), max_step)
    with open(config_path, "w") as f:
        f.write(yaml_text(config))
    result = subprocess.run(
        [
            opennmt_main(args.venv),
            "--model",
            model_path,
            "--config",
            config_path,
            "--seed",
            str(spec["seed"]),
            "train",
        ],
        capture_output=True,
        text=True,
        env=opennmt_env(),
        check=False,
    )
    with open(os.path.join(run_dir, "onmt-main.log"), "w") as f:
        f.write(result.stderr)
    if result.returncode:
        tail = " | ".join(result.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"onmt-main exited with {result.returncode}: {tail}"[:400])
    return parse_opennmt_log(result.stderr, args.opennmt_warmup)


# --- results -------------------------------------------------------------------------


class Result:
    """One configuration's outcome: per-round tokens/s, or why there are none."""

    def __init__(self, name):
        self.name, self.status, self.reason = name, "measured", ""
        self.rates, self.params, self.warmup_seconds = [], None, None
        self.update_tokens = []  # mean target tokens per update, per round
        self.method = METHODS["opennmt" if "opennmt" in name else "in_process"]

    def fail(self, reason, status="error"):
        self.status, self.reason, self.rates = status, reason, []

    def add(self, segment):
        self.rates.append(segment["tokens"] / segment["seconds"])
        self.update_tokens.append(segment["tokens"] / segment["updates"])
        if segment.get("params"):
            self.params = segment["params"]

    def summary(self, flops_per_token, peaks):
        out = {"status": self.status, "dtype": DTYPES[self.name], "method": self.method}
        if self.status != "measured":
            return {**out, "reason": self.reason}
        if not self.rates:
            return {**out, "status": "error", "reason": "no measurement"}
        median = statistics.median(self.rates)
        return {
            **out,
            "tokens_per_s": median,
            "tokens_per_s_rounds": self.rates,
            "spread_percent": spread(self.rates),
            "params": self.params,
            "warmup_seconds": self.warmup_seconds,
            "target_tokens_per_update": statistics.median(self.update_tokens),
            "mfu": median * flops_per_token / peaks[DTYPES[self.name]],
        }


def spread(values):
    import benchlib

    return benchlib.spread(values) if len(values) > 1 else 0.0


def ratios(summaries):
    """Median over rounds of t2t_lite config / peer, for every measured pair."""
    import benchlib

    out = {}
    for mine in (n for n in ALL_CONFIGS if n.startswith("t2t")):
        for peer in PEERS:
            a, b = summaries.get(mine, {}), summaries.get(peer, {})
            if "tokens_per_s_rounds" in a and "tokens_per_s_rounds" in b:
                out[f"{mine}/{peer}"] = benchlib.median_ratio(
                    a["tokens_per_s_rounds"], b["tokens_per_s_rounds"]
                )
    return out


# --- parent side: the benchmark -----------------------------------------------------------


def prepare(args):
    """Work dir, data (batches, text corpus), the spec file workers read."""
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="bench_peers_")
    os.makedirs(args.work_dir, exist_ok=True)
    spec = model_spec(args, args.work_dir)
    pairs = synthetic_pairs(
        args.corpus_sentences,
        args.vocab_size,
        args.mean_length,
        args.max_length,
        args.seed,
    )
    batches = make_batches(args, spec, pairs)
    paths = write_text_corpus(
        pairs, args.vocab_size, os.path.join(args.work_dir, "corpus")
    )
    spec_path = os.path.join(args.work_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    return spec, spec_path, batches, paths


def run_rounds(args, spec, paths, workers, results):
    """benchlib.interleave over the configs still standing: each trains --updates
    updates per round, in a rotating order."""
    import benchlib

    def run_one(name, round_index):
        result = results[name]
        if result.status != "measured":
            return
        try:
            if name == "opennmt_f32":
                segment = run_opennmt(spec, paths, args, round_index)
            else:
                segment = workers[name].ask("run")
                if "error" in segment:
                    raise RuntimeError(segment["error"])
            result.add(segment)
        except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
            result.fail(error_line(exc))
        print(
            f"  round {round_index + 1} {name}: "
            + (
                f"{result.rates[-1]:.0f} tokens/s"
                if result.status == "measured"
                else result.reason
            ),
            flush=True,
        )

    benchlib.interleave(args.configs, args.rounds, run_one, label="round")


def describe_data(batches, spec):
    rows = sum(len(b["targets"]) for b in batches)
    return (
        f"corpus of {spec['corpus_sentences']} sentence pairs, vocab "
        f"{spec['vocab_size']}; t2t_lite/Keras batches: {len(batches)} micro-batches "
        f"({len(batches) // spec['accumulate_steps']} updates of "
        f"{spec['accumulate_steps']}), {rows} sentence pairs, "
        f"{target_tokens(batches)} non-pad target tokens"
    )


def print_table(report):
    s = report["setup"]
    print(f"\n{report['environment']}")
    print(
        f"model: {s['num_layers']}+{s['num_layers']} layers, hidden {s['hidden_size']},"
        f" filter {s['filter_size']}, {s['num_heads']} heads; {report['data']}; "
        f"{report['rounds']} rounds x {report['updates']} updates (medians)"
    )
    print(
        f"peak tf.matmul 2048^2: float32 {report['peak_flops']['float32'] / 1e9:.0f} "
        f"GFLOP/s, bfloat16 {report['peak_flops']['bfloat16'] / 1e9:.0f} GFLOP/s; "
        f"{report['flops_per_target_token'] / 1e6:.1f} MFLOP per target token"
    )
    header = (
        f"{'config':<12} {'dtype':<9} {'params':>9} {'tokens/s':>9} "
        f"{'spread':>7} {'MFU':>6} {'tok/update':>10} {'warmup s':>8}"
    )
    print(header + "\n" + "-" * len(header))
    for name, c in report["configs"].items():
        if "tokens_per_s" not in c:
            print(f"{name:<12} {c['dtype']:<9} {c['status']}: {c['reason']}")
            continue
        warm = f"{c['warmup_seconds']:.0f}" if c["warmup_seconds"] else "-"
        print(
            f"{name:<12} {c['dtype']:<9} {c['params'] or 0:>9} "
            f"{c['tokens_per_s']:>9.0f} {c['spread_percent']:>6.1f}% "
            f"{100 * c['mfu']:>5.1f}% {c['target_tokens_per_update']:>10.0f} {warm:>8}"
        )
    print(
        "tokens/s: non-pad target tokens (EOS included) per second; OpenNMT-tf: its "
        "logged target tokens/s.\nspread: (max - min) / median over rounds; "
        "tok/update: target tokens per update; warmup s: build + warmup, all "
        "workers at once."
    )
    print("\nratios (median over rounds of per-round tokens/s ratios):")
    for pair, value in report["ratios"].items():
        print(f"  {pair:<24} {value:.2f}x")


def run_benchmark(args):
    import benchlib

    spec, spec_path, batches, paths = prepare(args)
    print(f"data: {describe_data(batches, spec)}; work dir {args.work_dir}", flush=True)
    results = {name: Result(name) for name in args.configs}
    if "opennmt_f32" in results and not os.path.exists(opennmt_main(args.venv)):
        results["opennmt_f32"].fail(
            f"no OpenNMT-tf venv at {args.venv}: run with --setup_opennmt first",
            status="skipped",
        )
    in_process = [n for n in args.configs if not n.startswith("opennmt")]
    workers = start_workers(in_process, spec_path, args.work_dir, results)
    peaks = measure_peaks()
    try:
        run_rounds(args, spec, paths, workers, results)
    finally:
        for worker in workers.values():
            worker.close()
    peaks = measure_peaks(peaks)
    flops, tokens = training_flops(batches, spec)
    summaries = {
        n: results[n].summary(flops / tokens, peaks)
        if n in results
        else {"status": "skipped", "dtype": DTYPES[n], "reason": "not in --configs"}
        for n in ALL_CONFIGS
    }
    return {
        "benchmark": "bench_peers",
        "smoke": args.smoke,
        "environment": benchlib.environment(),
        "data": describe_data(batches, spec),
        "setup": {k: v for k, v in spec.items() if not k.endswith("batches_path")},
        "rounds": args.rounds,
        "updates": args.updates,
        "flops_per_target_token": flops / tokens,
        "peak_flops": peaks,
        "configs": summaries,
        "ratios": ratios(summaries),
    }


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        worker_main(args.worker, args.spec)
        return
    if args.setup_opennmt:
        setup_opennmt(args.venv)
        return
    import benchlib

    start = time.perf_counter()
    benchlib.print_start()
    report = run_benchmark(args)
    print_table(report)
    print(
        f"\ntotal wall time {time.perf_counter() - start:.0f}s, "
        f"load average at end: {benchlib.load_average()}"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
