"""bench_fit.py's configurations, as its children build them: t2t_lite's TrainStep
(with or without recompute_grad) and the Keras peer, each stepping one accumulate and
one update micro-step with the allocator's peak read around each; and the
micro-batches they step on.

A config offers `prepare(batch)` (the batch as it trains on it), `window(prepared)`
(one accumulate + update step: a record per micro-step) and `state()` (the bytes of
its weights, Adam slots and accumulators)."""

import time

import keras
import numpy as np
import tensorflow as tf

from benchkit import builds
from benchkit.memory import allocator, optimizer_parts, reset_peak, variable_bytes
from benchkit.peers import corpus
from benchkit.peers.keras_peer import KerasSession, keras_examples
from benchkit.peers.t2t_session import t2t_hparams


def sentence_ids(sentences, length, vocab_size, seed):
    """[sentences, length] int32 ids, none of them pad (0): corpus.synthetic_pairs'
    token stream (Zipf ids, EOS 1 where its sentences end), cut into rows."""
    count = max(8, 2 * sentences)
    while True:
        pairs = corpus.synthetic_pairs(count, vocab_size, length, length, seed)
        stream = np.concatenate([ids for pair in pairs for ids in pair])
        if stream.size >= sentences * length:
            return stream[: sentences * length].reshape(sentences, length)
        count *= 2


def batch_of(sentences, spec):
    """A micro-batch as the train step takes it (numpy): source and target rows."""
    length, vocab_size = spec["max_tokens"], spec["vocab_size"]
    ids = sentence_ids(2 * sentences, length, vocab_size, spec["seed"])
    return {"inputs": ids[:sentences], "targets": ids[sentences:]}


class T2TConfig:
    """t2t_lite's TrainStep with n=2, float32; recompute_grad for t2t_recompute."""

    def __init__(self, name, spec):
        hp = t2t_hparams(spec, "float32").override(
            recompute_grad=name == "t2t_recompute"
        )
        self.parts = builds.build_seeded_parts(
            hp, spec["vocab_size"], 100000, spec["seed"]
        )
        self.step = self.parts.step

    def state(self):
        slots, _, other = optimizer_parts(self.parts.optimizer)
        return {
            "weights": variable_bytes(self.parts.model.trainable_variables),
            "slots": variable_bytes(slots),
            "accumulators": variable_bytes(self.step.accumulator.variables),
            "optimizer_other": variable_bytes(other),
        }

    def prepare(self, batch):
        return {k: tf.constant(v) for k, v in batch.items()}

    def window(self, batch):
        """One step (accumulate, then update) on `batch`; per micro-step records."""
        records = []
        for kind, function in (
            ("accumulate", self.step.accumulate),
            ("update", self.step.accumulate_and_update),
        ):
            live = allocator()[0]
            reset_peak()
            start, cpu = time.perf_counter(), time.process_time()
            out = function(batch)
            float(out["loss_sum"][0])  # on a CPU the call returns when done; to be sure
            seconds = time.perf_counter() - start
            cpu_seconds = time.process_time() - cpu
            current, peak = allocator()
            records.append(
                {
                    "kind": kind,
                    "live": live,
                    "peak": peak,
                    "after": current,
                    "seconds": seconds,
                    "cpu_seconds": cpu_seconds,
                }
            )
        return records


class KerasConfig:
    """bench_peers' Keras peer (peers/keras_peer.py): built and compiled by
    KerasSession, trained with model.fit, two steps per call (Adam's
    gradient_accumulation_steps=2)."""

    def __init__(self, name, spec):
        self.session = KerasSession(name, spec, [batch_of(1, spec), batch_of(1, spec)])
        self.model = self.session.model
        self.optimizer = self.model.optimizer
        self.n = spec["accumulate_steps"]
        self.records = []
        outer = self

        class Probe(keras.callbacks.Callback):
            """Resets the allocator's peak before each fit step, reads it after."""

            def on_train_batch_begin(self, batch, logs=None):
                micro_step = int(outer.optimizer._iterations.numpy())  # micro-steps
                kind = "update" if (micro_step + 1) % outer.n == 0 else "accumulate"
                live = allocator()[0]
                reset_peak()
                outer.records.append({"kind": kind, "live": live})
                outer.started = time.perf_counter(), time.process_time()

            def on_train_batch_end(self, batch, logs=None):
                seconds = time.perf_counter() - outer.started[0]
                cpu_seconds = time.process_time() - outer.started[1]
                current, peak = allocator()
                outer.records[-1].update(
                    peak=peak, after=current, seconds=seconds, cpu_seconds=cpu_seconds
                )

        self.probe = Probe()

    def state(self):
        if not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)
        slots, accumulators, other = optimizer_parts(self.optimizer)
        return {
            "weights": variable_bytes(self.model.trainable_variables),
            "slots": variable_bytes(slots),
            "accumulators": variable_bytes(accumulators),
            "optimizer_other": variable_bytes(other),
        }

    def prepare(self, batch):
        """A two-step dataset of `batch` with a [None, None] signature (so that
        model.fit traces once for every size), as KerasSession makes its data."""
        examples = keras_examples([batch, batch])

        def spec_of(array):
            return tf.TensorSpec([None, None], tf.as_dtype(array.dtype))

        return tf.data.Dataset.from_generator(
            lambda: iter(examples),
            output_signature=tf.nest.map_structure(spec_of, examples[0]),
        )

    def window(self, data):
        self.records = []
        self.model.fit(
            data, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[self.probe]
        )
        if [r["kind"] for r in self.records] != ["accumulate", "update"]:
            raise RuntimeError(f"Keras steps out of phase: {self.records}")
        return self.records


def build_config(name, spec):
    if name.startswith("keras"):
        return KerasConfig(name, spec)
    return T2TConfig(name, spec)


def step_record(micro):
    """A step's numbers from its two micro-step records."""
    return {
        "live": micro[0]["live"],
        "peak": max(m["peak"] for m in micro),
        "seconds": sum(m["seconds"] for m in micro),
        "cpu_seconds": sum(m["cpu_seconds"] for m in micro),
        "micro": micro,
    }
