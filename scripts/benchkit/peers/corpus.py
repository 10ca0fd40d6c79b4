"""The synthetic parallel corpus bench_peers.py and bench_fit.py train on, and its
forms: t2t_lite's micro-batches (saved for worker processes) and OpenNMT's text files.

The corpus is synthetic so that every framework sees exactly the same sentences with
no download: lognormal sentence lengths and Zipf-distributed ids, as text has.
"""

import inspect
import os

import numpy as np


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
    """A stand-in for a registered problem: builds.fixed_batches (t2t_lite's own
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
