"""Text-to-text problems: text pairs → SentencePiece ids → TFRecord shards in data_dir.

A TextProblem has two sides:

- datagen (t2t-datagen, see data/datagen.py): `corpus(config)` returns the problem's
  source of (source, target) sentence pairs for the "train" and "dev" splits, and
  "test" when its `has_test_split()` says so; datagen trains the vocabulary on the
  training pairs and writes the shards and manifest.
- training/decoding: `load(data_dir)` reads the manifest and the vocabulary, then
  `vocab_size`, `vocab_fingerprint()`, `dataset(split, data_dir)` (parallel TFRecord
  reads) and `decode(ids)` work as for every Problem.

`TranslateParallelText` is the problem for the user's own line-aligned files.
"""

import os

import numpy as np

from t2t_lite.data import text_io, tfrecords
from t2t_lite.data.problems import ALL_SPLITS, Problem, check_split
from t2t_lite.data.vocab import SubwordVocab, VocabError
from t2t_lite.errors import UserError

SIDES = ("source", "target")
FILE_OPTIONS = (
    "train_source",
    "train_target",
    "dev_source",
    "dev_target",
    "test_source",
    "test_target",
)


def vocab_file_names(problem_name, shared):
    """{"source": file name, "target": file name} of a problem's vocabulary models."""
    if shared:
        name = f"{problem_name}.vocab.model"
        return {"source": name, "target": name}
    return {side: f"{problem_name}.vocab.{side}.model" for side in SIDES}


def reject_options(problem_name, config, options, why):
    """A UserError if any of `options` (DatagenConfig fields) is set."""
    for option in options:
        if getattr(config, option):
            raise UserError(f"{option} is not used by problem {problem_name} ({why}).")


class TextProblem(Problem):
    """A problem whose data t2t-datagen writes into data_dir (vocab + TFRecords)."""

    default_vocab_size = 8000  # used when the datagen config's vocab_size is 0
    reports_bleu = True  # translation: evaluations report BLEU on dev text

    def __init__(self):
        self._data_dir = None
        self._manifest = None
        self._vocabs = None  # {"source": SubwordVocab, "target": SubwordVocab}

    # --- datagen side ---------------------------------------------------------------

    def corpus(self, config):
        """The source of text pairs for t2t-datagen (see ParallelFilesCorpus)."""
        raise NotImplementedError(f"{type(self).__name__} must define corpus().")

    # --- reading side ---------------------------------------------------------------

    def load(self, data_dir):
        """Reads the manifest and vocabulary written by t2t-datagen into data_dir."""
        rerun = self._rerun(data_dir)
        if not data_dir:
            raise UserError(
                f"problem {self.name} reads its data from data_dir: {rerun} "
                f"first, then give the same data_dir."
            )
        if not os.path.isdir(data_dir):
            raise UserError(f"data_dir '{data_dir}' does not exist; {rerun} first.")
        manifest = self._read_manifest(data_dir, rerun)
        vocabs = {}
        for side, name in manifest["vocab"]["files"].items():
            path = os.path.join(data_dir, name)
            try:
                vocabs[side] = SubwordVocab(path)
            except VocabError as e:
                raise VocabError(f"{str(e).rstrip('.')}; {rerun}, overwrite.") from None
            if vocabs[side].sha256 != manifest["vocab"]["sha256"][side]:
                raise VocabError(
                    f"{path} was changed after t2t-datagen wrote the data in "
                    f"{data_dir} (its SHA-256 differs from the manifest's); "
                    f"{rerun}, overwrite."
                )
        self._data_dir, self._manifest, self._vocabs = data_dir, manifest, vocabs

    def _rerun(self, data_dir):
        """What to run to (re)generate the data, in argument terms."""
        return f"run t2t-datagen with problem={self.name}, data_dir={data_dir or 'DIR'}"

    def _read_manifest(self, data_dir, rerun):
        path = tfrecords.manifest_path(data_dir, self.name)
        try:
            manifest = tfrecords.read_manifest(data_dir, self.name)
        except ValueError as e:
            raise UserError(f"{e}; {rerun}, overwrite.") from None
        if manifest is None:
            prefix = f"{self.name}-"
            partial = any(n.startswith(prefix) for n in os.listdir(data_dir))
            state = (
                "the data there is incomplete (interrupted t2t-datagen?)"
                if partial
                else f"no data of {self.name} there"
            )
            raise UserError(f"{path} not found: {state}; {rerun} first.")
        return manifest

    def _loaded(self):
        if self._vocabs is None:
            raise RuntimeError(f"{self.name}: call load(data_dir) first.")
        return self._manifest, self._vocabs

    @property
    def vocab_size(self):
        """Ids of both sides share one space: the larger vocabulary's size."""
        _, vocabs = self._loaded()
        return max(v.size for v in vocabs.values())

    def vocab_fingerprint(self):
        manifest, vocabs = self._loaded()
        shared = manifest["vocab"]["shared"]
        sizes = "/".join(str(vocabs[s].size) for s in SIDES)
        digest = manifest["vocab"]["fingerprint"]
        return f"sentencepiece:{'shared' if shared else 'separate'}:{sizes}:{digest}"

    @property
    def source_vocab(self):
        return self._loaded()[1]["source"]

    @property
    def target_vocab(self):
        return self._loaded()[1]["target"]

    def generate(self, split):
        raise NotImplementedError(
            f"{self.name} is read from TFRecord files: use dataset(split, data_dir)."
        )

    def dataset(self, split, data_dir=None):
        """Unbatched {"inputs", "targets"} int32 datasets read from the split's shards;
        the training split's shards are read in a reshuffled order every epoch."""
        paths = self._shard_paths(split, data_dir)
        return tfrecords.read_dataset(paths, shuffle_files=split == "train")

    def replica_dataset(self, split, data_dir, replica, num_replicas):
        """File-level sharding (each replica reads only its own files) when there are
        at least as many files as replicas; example-level sharding otherwise."""
        paths = self._shard_paths(split, data_dir)
        if num_replicas <= 1 or len(paths) < num_replicas:
            return super().replica_dataset(split, data_dir, replica, num_replicas)
        mine = paths[replica::num_replicas]
        return tfrecords.read_dataset(mine, shuffle_files=split == "train")

    def has_split(self, split):
        """Whether t2t-datagen wrote `split` (a test split is optional: data dirs
        written without one, or before test splits existed, have train and dev)."""
        manifest, _ = self._loaded()
        return split in manifest["splits"]

    def require_split(self, split):
        """A one-line UserError unless the loaded data dir holds `split`."""
        if not self.has_split(check_split(split, ALL_SPLITS)):
            raise UserError(
                f"the data of {self.name} in {self._data_dir} has no {split} split "
                f"(t2t-datagen writes one from test_source/test_target, or from the "
                f"TFDS dataset's test split); {self._rerun(self._data_dir)}, "
                f"overwrite, to add it."
            )

    def _shard_paths(self, split, data_dir):
        check_split(split, ALL_SPLITS)
        if self._vocabs is None or (data_dir and data_dir != self._data_dir):
            self.load(data_dir)
        self.require_split(split)
        manifest, _ = self._loaded()
        paths = [
            os.path.join(self._data_dir, name)
            for name in manifest["splits"][split]["shards"]
        ]
        for path in paths:
            if not os.path.exists(path):
                raise UserError(
                    f"{path} is listed in {self.name}.manifest.json but missing; "
                    f"{self._rerun(self._data_dir)}, overwrite."
                )
        return paths

    def split_text(self, split):
        """The sentences of `split` ("dev" or "test") t2t-datagen kept as text,
        aligned with the split's shard."""
        self.require_split(split)
        manifest, _ = self._loaded()
        texts = []
        for side in SIDES:
            path = os.path.join(self._data_dir, manifest["splits"][split]["text"][side])
            texts.append([text for _, text in text_io.read_lines(path)])
        return texts[0], texts[1]

    def encode_inputs(self, text):
        """Source text → ids ending with EOS (what the decoder feeds the model)."""
        return self.source_vocab.encode_one(text)

    def decode_inputs(self, ids):
        return self.source_vocab.decode(ids)

    def decode(self, ids):
        """Target ids → text (stops at EOS, skips padding)."""
        return self.target_vocab.decode(ids)


class ParallelFilesCorpus:
    """Sentence pairs from line-aligned source/target files (lists, concatenated).

    Without dev files, `dev_holdout` random training pairs (at most a tenth of them)
    become the dev set, chosen with `seed` once the lines have been counted by
    `check()`. Test files are optional and never held out of anything.
    """

    def __init__(self, train_files, dev_files, dev_holdout, seed, test_files=()):
        self.files = {"train": list(train_files), "dev": list(dev_files)}
        if test_files:
            self.files["test"] = list(test_files)
        self.dev_holdout = dev_holdout
        self.seed = seed
        self._counts = None
        self._holdout = frozenset()

    def describe(self):
        """What the generated data depends on (compared on re-runs)."""
        described = {
            split: [[_file_identity(s), _file_identity(t)] for s, t in files]
            for split, files in self.files.items()
        }
        if not self.files["dev"]:
            described["dev_holdout"] = [self.dev_holdout, self.seed]
        return described

    def check(self, log):
        """Reads every file once (encoding, alignment); nothing is written."""
        self._counts = {}
        for split, files in self.files.items():
            count = 0
            for source, target in files:
                log(f"Checking {source} and {target} ...")
                # Reading to the end checks every line; the last count is the file's.
                for count_in_file, _, _ in text_io.read_parallel(source, target):  # noqa: B007
                    pass
                count += count_in_file
            self._counts[split] = count
        if not self.files["dev"]:
            self._choose_holdout(log)

    def has_test_split(self):
        return "test" in self.files

    def _choose_holdout(self, log):
        total = self._counts["train"]
        k = min(self.dev_holdout, total // 10)
        if k <= 0:
            raise UserError(
                f"no dev files and too few training lines ({total}) to hold out a "
                f"dev set (dev_holdout={self.dev_holdout}); give dev_source and "
                f"dev_target."
            )
        rng = np.random.default_rng(self.seed)
        self._holdout = frozenset(rng.choice(total, size=k, replace=False).tolist())
        self._counts.update(train=total - k, dev=k)
        log(f"No dev_source/dev_target: holding out {k} random training pairs as dev.")

    def size(self, split):
        return None if self._counts is None else self._counts[split]

    def pairs(self, split):
        """Yields (source, target) strings of a split (empty lines included)."""
        if split != "test" and not self.files["dev"]:
            if self._counts is None:
                raise RuntimeError("ParallelFilesCorpus: call check() before pairs().")
            keep_dev = split == "dev"
            for index, pair in enumerate(self._all_pairs("train")):
                if (index in self._holdout) == keep_dev:
                    yield pair
        else:
            yield from self._all_pairs(split)

    def _all_pairs(self, split):
        for source, target in self.files[split]:
            for _, src, tgt in text_io.read_parallel(source, target):
                yield src, tgt


def _file_identity(path):
    stat = os.stat(path) if os.path.exists(path) else None
    return {
        "path": os.path.abspath(path),
        "bytes": stat.st_size if stat else None,
        "mtime_ns": stat.st_mtime_ns if stat else None,
    }


class TranslateParallelText(TextProblem):
    """The user's own parallel files: --train_source/--train_target (+ dev, + test)
    in t2t-datagen; one sentence per line, UTF-8, plain or .gz, comma-separated lists."""

    name = "translate_parallel_text"
    default_vocab_size = 8000

    def corpus(self, config):
        reject_options(
            self.name,
            config,
            ("tfds_data_dir", "tfds_manual_dir"),
            "it reads train_source/train_target files",
        )
        if not config.train_source or not config.train_target:
            raise UserError(
                f"problem {self.name} needs train_source and train_target "
                f"(line-aligned files, one sentence per line)."
            )
        text_io.check_file_lists(config.train_source, config.train_target, "train")
        text_io.check_file_lists(config.dev_source, config.dev_target, "dev")
        text_io.check_file_lists(config.test_source, config.test_target, "test")
        return ParallelFilesCorpus(
            zip(config.train_source, config.train_target),
            zip(config.dev_source, config.dev_target),
            config.dev_holdout,
            config.seed,
            test_files=list(zip(config.test_source, config.test_target)),
        )
