"""The t2t_lite configurations of bench_peers.py (and bench_fit.py's model): a run
built the trainer's way (build_training), trained on in-memory batches."""

import inspect
import time

import numpy as np
import tensorflow as tf

from benchkit import builds
from benchkit.peers.corpus import target_tokens

DTYPES = {"t2t_f32": "float32", "t2t_bf16": "bfloat16", "t2t_xla": "float32"}


def t2t_hparams(spec, activation_dtype):
    """transformer_base with the benchmark's sizes, dropout, batching and n."""
    return builds.hparams(
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
        hp = t2t_hparams(spec, DTYPES[name])
        options = {}
        if name == "t2t_xla":
            if "jit_compile" not in inspect.signature(builds.build_training).parameters:
                raise RuntimeError(
                    "unavailable: build_training has no jit_compile keyword"
                )
            options["jit_compile"] = True
        parts = builds.build_seeded_parts(
            hp, spec["vocab_size"], 100000, spec["seed"], **options
        )
        self.step, self.micro_step = parts.step, 0
        self.params = int(
            sum(np.prod(v.shape) for v in parts.model.trainable_variables)
        )
        self.batches = [{k: tf.constant(v) for k, v in b.items()} for b in batches]
        self.tokens = [target_tokens([b]) for b in batches]
        self.n = spec["accumulate_steps"]
        # XLA compiles once per batch shape: warm up on every batch, not one update.
        self.warmup_batches = None if name == "t2t_xla" else spec["accumulate_steps"]

    def segment(self, count=None):
        """Trains on the first `count` batches (default all: a whole number of
        updates), timed."""
        start = time.perf_counter()
        for batch in self.batches[:count]:
            out = builds.micro_step(self.step, batch, self.micro_step)
            self.micro_step += 1
        float(tf.nest.flatten(out)[0])  # on CPU a call returns when done; to be sure
        seconds = time.perf_counter() - start
        tokens = self.tokens[:count]
        updates = len(tokens) // self.n
        return {"tokens": sum(tokens), "seconds": seconds, "updates": updates}
