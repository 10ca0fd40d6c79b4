"""t2t-datagen's library side: a TextProblem's corpus → vocabulary + TFRecord shards.

Stages, each logged:
  1. check the inputs (every file read once: encoding, alignment; nothing written);
  2. train the SentencePiece vocabulary (shared, or one per side) on the training pairs;
  3. encode and write the training pairs to random shards in tmp_dir, then shuffle
     each shard into data_dir; write dev (one shard, corpus order) and its text, and
     the same for test when the corpus has a test split (test files, a TFDS test
     split, the numbers problem's generated one);
  4. write the manifest last: from then on the data_dir reads as complete.

Re-running with the same inputs and settings finds the manifest and does nothing;
different settings are refused unless `overwrite` (the old manifest is deleted first,
so an interrupted overwrite never reads as valid data). Data written before test splits
existed stays valid: a re-run that would only add a test split says so and does
nothing (overwrite adds it), unless test files were given explicitly.
"""

import dataclasses
import json
import os
import time

import numpy as np

from t2t_lite.data import datagen_report, tfrecords
from t2t_lite.data.datagen_report import SplitStats
from t2t_lite.data.text_problems import FILE_OPTIONS, SIDES, vocab_file_names
from t2t_lite.data.vocab import train_sentencepiece
from t2t_lite.errors import UserError
from t2t_lite.fileio import write_atomically

_ENCODE_CHUNK = 2000  # pairs encoded per SentencePiece call (multi-threaded)
DROP_EMPTY = "empty source or target"
DROP_TOO_LONG = "longer than max_length"


@dataclasses.dataclass
class DatagenConfig:
    """Everything t2t-datagen can be told (its flags, as plain values)."""

    vocab_size: int = 0  # 0: the problem's default_vocab_size
    shared_vocab: bool = True  # one vocabulary for source and target
    vocab_sample_size: int = 1_000_000  # sentences SentencePiece trains on, at most
    character_coverage: float = 1.0  # SentencePiece's character_coverage
    num_shards: int = 10  # training shards (dev has one)
    max_examples: int = 0  # 0: all training pairs; else stop after this many
    max_length: int = 0  # 0: keep all; else drop pairs with a side longer (ids)
    train_source: tuple = ()
    train_target: tuple = ()
    dev_source: tuple = ()
    dev_target: tuple = ()
    test_source: tuple = ()  # optional test split (e.g. newstest2014), kept like dev
    test_target: tuple = ()
    dev_holdout: int = 1000  # dev pairs held out of train when no dev files
    tfds_data_dir: str = ""
    tfds_manual_dir: str = ""
    seed: int = 1
    overwrite: bool = False
    log_every: int = 100_000  # progress line every this many pairs


def check_config(config):
    for name, minimum in (
        ("vocab_size", 0),
        ("vocab_sample_size", 1),
        ("num_shards", 1),
        ("max_examples", 0),
        ("max_length", 0),
        ("dev_holdout", 0),
        ("log_every", 1),
    ):
        value = getattr(config, name)
        if value < minimum:
            raise UserError(f"{name} must be >= {minimum}, got {value}.")
    if not 0.0 < config.character_coverage <= 1.0:
        raise UserError(
            f"character_coverage must be in (0, 1], got {config.character_coverage}."
        )


def generate(problem, data_dir, tmp_dir=None, config=None, log=print):
    """Generates `problem`'s data into data_dir; returns the summary dict.

    The summary is also stored in the manifest; on a re-run that has nothing to do,
    the stored one is returned with "skipped": True.
    """
    config = config or DatagenConfig()
    check_config(config)
    corpus = problem.corpus(config)
    identity = _identity(problem, corpus, config)
    existing = _existing_manifest(problem, data_dir, identity, config)
    if existing is not None:
        if _jsonable(identity) == existing.get("identity"):
            log(
                f"{data_dir} already holds {problem.name} generated from the same "
                f"inputs and settings; nothing to do (set overwrite to regenerate)."
            )
        else:
            log(
                f"{data_dir} holds {problem.name} data written without a test split; "
                f"keeping it, nothing to do (set overwrite to regenerate it with one)."
            )
        return {**existing["summary"], "skipped": True}
    started = time.perf_counter()
    corpus.check(log)  # Bad inputs fail here, before anything is deleted or written.
    tmp_dir = tmp_dir or data_dir
    for directory in (data_dir, tmp_dir):
        os.makedirs(directory, exist_ok=True)
    manifest = tfrecords.manifest_path(data_dir, problem.name)
    if os.path.exists(manifest):
        os.remove(manifest)  # From here on, data_dir is not "complete" any more.
    tfrecords.remove_generated_files(data_dir, problem.name, tmp_dir)
    vocabs = _train_vocabs(problem, corpus, config, data_dir, log)
    splits, stats = _write_splits(
        problem, corpus, vocabs, config, data_dir, tmp_dir, log
    )
    summary = datagen_report.make_summary(
        problem, vocabs, stats, config, time.perf_counter() - started
    )
    tfrecords.write_manifest(
        data_dir,
        problem.name,
        {
            "problem": problem.name,
            "identity": identity,
            "splits": splits,
            "vocab": _vocab_entry(problem, vocabs, config),
            "summary": summary,
        },
    )
    return summary


def _identity(problem, corpus, config):
    """What the generated files depend on: compared with the manifest on re-runs."""
    settings = dataclasses.asdict(config)
    # Inputs are described by the corpus (absolute paths, sizes, times); the rest
    # does not change what is written.
    for key in ("overwrite", "log_every", "tfds_manual_dir", "tfds_data_dir"):
        settings.pop(key)
    for key in FILE_OPTIONS:
        settings.pop(key)
    settings["vocab_size"] = config.vocab_size or problem.default_vocab_size
    return {"corpus": corpus.describe(), "settings": settings}


def _existing_manifest(problem, data_dir, identity, config):
    """The manifest if data_dir already holds exactly this data; None to (re)generate."""
    try:
        manifest = tfrecords.read_manifest(data_dir, problem.name)
    except ValueError:
        return None  # Unreadable: regenerate.
    if manifest is None:
        return None
    same = _jsonable(identity) == manifest.get("identity")
    files_ok = all(
        os.path.exists(os.path.join(data_dir, name))
        for split in manifest["splits"].values()
        for name in split["shards"]
    )
    if same and files_ok:
        return None if config.overwrite else manifest
    if files_ok and not config.overwrite and _only_test_split_added(identity, manifest):
        if config.test_source:
            raise UserError(
                f"{data_dir} already holds {problem.name} data without a test split; "
                f"set overwrite to regenerate it with test_source/test_target."
            )
        return manifest  # written before test splits existed: still valid
    if not config.overwrite and files_ok:
        raise UserError(
            f"{data_dir} already holds {problem.name} data generated from other "
            f"inputs or settings ({_first_difference(identity, manifest['identity'])}); "
            f"use another data_dir, or set overwrite to replace it."
        )
    return None


def _without_test(value):
    """`value` with every dict entry named "test" removed, recursively."""
    if isinstance(value, dict):
        return {k: _without_test(v) for k, v in value.items() if k != "test"}
    if isinstance(value, list):
        return [_without_test(v) for v in value]
    return value


def _only_test_split_added(identity, manifest):
    """True if `manifest` (with no test split) differs from `identity` only by the
    test split the new inputs would add (data written before test splits existed)."""
    if "test" in manifest["splits"]:
        return False
    return _without_test(_jsonable(identity)) == _without_test(manifest.get("identity"))


def _jsonable(value):
    return json.loads(json.dumps(value))


def _first_difference(new, old, path=""):
    """'key.path: old then, new now' for the first differing leaf (for messages)."""
    new = _jsonable(new)
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        new, old = dict(enumerate(new)), dict(enumerate(old))
    if isinstance(new, dict) and isinstance(old, dict):
        for key in sorted(set(new) | set(old), key=str):
            if new.get(key) != old.get(key):
                return _first_difference(new.get(key), old.get(key), f"{path}{key}.")
    return f"{path.rstrip('.')}: {old!r} then, {new!r} now"


def _sentences(corpus, side, limit):
    """Sentences of the training pairs that will be written: one side or both (None)."""
    taken = 0
    for source, target in corpus.pairs("train"):
        if not source or not target:
            continue
        if limit and taken >= limit:
            return
        taken += 1
        if side != "target":
            yield source
        if side != "source":
            yield target


def _train_vocabs(problem, corpus, config, data_dir, log):
    vocab_size = config.vocab_size or problem.default_vocab_size
    names = vocab_file_names(problem.name, config.shared_vocab)
    vocabs = {}
    for side in SIDES:
        name = names[side]
        if config.shared_vocab and side == "target":
            vocabs[side] = vocabs["source"]
            continue
        started = time.perf_counter()
        log(f"Training SentencePiece vocabulary {name} ({vocab_size} pieces) ...")
        vocabs[side] = train_sentencepiece(
            _sentences(
                corpus, None if config.shared_vocab else side, config.max_examples
            ),
            os.path.join(data_dir, name),
            vocab_size,
            character_coverage=config.character_coverage,
            sample_size=config.vocab_sample_size,
            seed=config.seed,
        )
        log(f"  done in {time.perf_counter() - started:.1f}s.")
    return vocabs


def _vocab_entry(problem, vocabs, config):
    names = vocab_file_names(problem.name, config.shared_vocab)
    sha = {side: vocabs[side].sha256 for side in SIDES}
    digest = (
        sha["source"][:16]
        if config.shared_vocab
        else (sha["source"][:8] + sha["target"][:8])
    )
    return {
        "shared": config.shared_vocab,
        "files": names,
        "sizes": {side: vocabs[side].size for side in SIDES},
        "sha256": sha,
        "fingerprint": digest,
    }


def _chunks(pairs, stats, limit, progress):
    """Lists of non-empty (source, target) pairs; counts the empty ones as dropped."""
    chunk, taken = [], 0
    for source, target in pairs:
        if not source or not target:
            stats.drop(DROP_EMPTY)
            progress.add(1)
            continue
        if limit and taken >= limit:
            break
        chunk.append((source, target))
        taken += 1
        if len(chunk) == _ENCODE_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _encoded(pairs, vocabs, stats, config, progress, limit=0):
    """Yields (input_ids, target_ids, source, target), EOS-terminated, filtered;
    at most `limit` non-empty pairs are read (0: all)."""
    for chunk in _chunks(pairs, stats, limit, progress):
        inputs = vocabs["source"].encode([s for s, _ in chunk])
        targets = vocabs["target"].encode([t for _, t in chunk])
        for ids_in, ids_tgt, (source, target) in zip(inputs, targets, chunk):
            if config.max_length and max(len(ids_in), len(ids_tgt)) > config.max_length:
                stats.drop(DROP_TOO_LONG)
                continue
            stats.lengths["inputs"].append(len(ids_in))
            stats.lengths["targets"].append(len(ids_tgt))
            yield ids_in, ids_tgt, source, target
        progress.add(len(chunk))


def _write_train(problem, corpus, vocabs, config, data_dir, tmp_dir, log):
    """Random shards in tmp_dir, then each shuffled into data_dir. Returns names."""
    stats = SplitStats()
    n = config.num_shards
    names = [tfrecords.shard_name(problem.name, "train", i, n) for i in range(n)]
    unshuffled = [
        os.path.join(tmp_dir, f"{problem.name}-train-unshuffled-{i:05d}")
        for i in range(n)
    ]
    rng = np.random.default_rng([config.seed, 1])
    total = corpus.size("train")
    if config.max_examples and total:
        total = min(total, config.max_examples)
    progress = datagen_report.Progress("train", total, config.log_every, log)
    log(f"Encoding and writing training pairs to {n} shard(s) ...")
    with tfrecords.ShardWriter(unshuffled) as writer:
        for ids_in, ids_tgt, _, _ in _encoded(
            corpus.pairs("train"), vocabs, stats, config, progress, config.max_examples
        ):
            writer.write(
                tfrecords.serialize_example(ids_in, ids_tgt), int(rng.integers(n))
            )
            stats.written += 1
    log(f"Shuffling {n} shard(s) ...")
    stats.shard_examples = [
        tfrecords.shuffle_into(source, os.path.join(data_dir, name), rng)
        for source, name in zip(unshuffled, names)
    ]
    stats.seconds = time.perf_counter() - progress.start
    return names, stats


def _write_eval_split(problem, corpus, vocabs, config, data_dir, log, split="dev"):
    """One `split` ("dev" or "test") shard in corpus order, plus its kept text (for
    BLEU later)."""
    stats = SplitStats()
    name = tfrecords.shard_name(problem.name, split, 0, 1)
    progress = datagen_report.Progress(split, corpus.size(split), config.log_every, log)
    texts = {side: [] for side in SIDES}
    with tfrecords.ShardWriter([os.path.join(data_dir, name)]) as writer:
        for ids_in, ids_tgt, source, target in _encoded(
            corpus.pairs(split), vocabs, stats, config, progress
        ):
            writer.write(tfrecords.serialize_example(ids_in, ids_tgt))
            texts["source"].append(source)
            texts["target"].append(target)
            stats.written += 1
    stats.shard_examples = [stats.written]
    text_files = {}
    for side in SIDES:
        text_files[side] = f"{problem.name}-{split}.{side}.txt"
        write_atomically(
            os.path.join(data_dir, text_files[side]),
            "".join(f"{line}\n" for line in texts[side]).encode("utf-8"),
        )
    return [name], stats, text_files


def _write_splits(problem, corpus, vocabs, config, data_dir, tmp_dir, log):
    train_names, train = _write_train(
        problem, corpus, vocabs, config, data_dir, tmp_dir, log
    )
    stats = {"train": train}
    splits = {
        "train": {
            "shards": train_names,
            "shard_examples": train.shard_examples,
            **train.as_dict(),
        },
    }
    # A corpus without has_test_split (e.g. a user's) has train and dev only.
    has_test = getattr(corpus, "has_test_split", lambda: False)()
    for split in ("dev", "test") if has_test else ("dev",):
        names, stats[split], text = _write_eval_split(
            problem, corpus, vocabs, config, data_dir, log, split
        )
        splits[split] = {
            "shards": names,
            "shard_examples": stats[split].shard_examples,
            "text": text,
            **stats[split].as_dict(),
        }
    for split, split_stats in stats.items():
        if split_stats.written == 0:
            raise UserError(
                f"no {split} examples left to write for {problem.name} "
                f"(dropped: {split_stats.dropped or 'none'}); check the {split} data."
            )
    return splits, stats
