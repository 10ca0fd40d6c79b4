"""Translation problems read through tensorflow_datasets (TFDS), never downloaded.

t2t-datagen reads the TFDS dataset from the user's TFDS data dir (`--tfds_data_dir`,
default TFDS's own, ~/tensorflow_datasets), where it must already be prepared, e.g.
with `tfds build wmt14_translate/de-en` (add `--manual_dir` for manual downloads).
With `--tfds_manual_dir`, t2t-datagen asks TFDS to prepare it from that directory
first. The text pairs then take the same path as every text problem: SentencePiece
vocabulary, TFRecord shards and manifest in --data_dir. Training never touches TFDS.

`tensorflow_datasets` is imported only here and only when datagen runs, so the
trainer does not pay its import time.
"""

import contextlib
import tempfile

from t2t_lite.data.text_problems import FILE_OPTIONS, TextProblem, reject_options
from t2t_lite.errors import UserError
from t2t_lite.tf_data import without_autotuning

# name: (TFDS dataset, source key, target key, {our split: TFDS split}); "test" is
# written where the prepared dataset has it (wmt14: newstest2014, wmt17: newstest2017).
_WMT = {"train": "train", "dev": "validation", "test": "test"}
TFDS_TRANSLATE = {
    "translate_wmt14_en_de": ("wmt14_translate/de-en", "en", "de", _WMT),
    "translate_wmt14_de_en": ("wmt14_translate/de-en", "de", "en", _WMT),
    "translate_wmt14_en_fr": ("wmt14_translate/fr-en", "en", "fr", _WMT),
    "translate_wmt14_fr_en": ("wmt14_translate/fr-en", "fr", "en", _WMT),
    "translate_wmt17_en_de": ("wmt17_translate/de-en", "en", "de", _WMT),
    "translate_ted_pt_en": (
        "ted_hrlr_translate/pt_to_en",
        "pt",
        "en",
        {"train": "train", "dev": "validation", "test": "test"},
    ),
}


def _tfds():
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    return tfds


@contextlib.contextmanager
def _own_temp_folder():
    """TFDS calls inside it get a temporary folder of their own, removed afterwards.

    For every builder of a dataset not prepared yet, TFDS (4.9) makes an empty
    folder in the temporary directory (DatasetInfo.initialize_from_bucket, even with
    GCS off) and never removes it; every datagen run would leave one behind. The
    folder is set process-wide (tempfile.tempdir): datagen calls TFDS from one thread.
    """
    with tempfile.TemporaryDirectory(prefix="t2t_lite_tfds_") as folder:
        previous, tempfile.tempdir = tempfile.tempdir, folder
        try:
            yield
        finally:
            tempfile.tempdir = previous


class TfdsCorpus:
    """(source, target) pairs of one TFDS translation dataset."""

    def __init__(self, dataset_name, source_key, target_key, splits, config):
        self.dataset_name = dataset_name
        self.keys = (source_key, target_key)
        self.splits = splits
        self._missing = set()  # our splits the prepared dataset does not have
        self.data_dir = config.tfds_data_dir or None
        self.manual_dir = config.tfds_manual_dir or None
        self._sizes = {}

    def describe(self):
        return {
            "tfds": self.dataset_name,
            "keys": list(self.keys),
            "splits": self.splits,
            "tfds_data_dir": self.data_dir,
        }

    def _where(self):
        return self.data_dir or "the default TFDS data dir (~/tensorflow_datasets)"

    def check(self, log):
        """Prepares from tfds_manual_dir if given; checks both splits can be read."""
        tfds = _tfds()
        if self.manual_dir:
            log(f"Preparing {self.dataset_name} from {self.manual_dir} with TFDS ...")
            with _own_temp_folder():
                builder = tfds.builder(self.dataset_name, data_dir=self.data_dir)
            config = tfds.download.DownloadConfig(manual_dir=self.manual_dir)
            try:
                builder.download_and_prepare(download_config=config)
            except Exception as e:  # noqa: BLE001  (TFDS raises many kinds here)
                raise UserError(
                    f"TFDS could not prepare {self.dataset_name} from "
                    f"tfds_manual_dir '{self.manual_dir}': {_first_sentence(e)}"
                ) from None
        for split in self.splits:
            if split == "test" and not self._has_tfds_split(split):
                self._missing.add(split)
                log(f"TFDS {self.dataset_name} has no test split; writing none.")
                continue
            self._load(split)  # Fails here, before anything is written.
            log(
                f"TFDS {self.dataset_name} [{self.splits[split]}] found in {self._where()}."
            )

    def _has_tfds_split(self, split):
        """Whether the prepared dataset lists `split` (checked after train loaded;
        a dataset whose info lists no splits at all, as under mock_data, is tried)."""
        _, info = self._load_with_info("train")
        known = set(info.splits.keys())
        return not known or self.splits[split] in known

    def has_test_split(self):
        return "test" in self.splits and "test" not in self._missing

    def _load(self, split):
        return self._load_with_info(split)[0]

    def _load_with_info(self, split):
        tfds = _tfds()
        tfds_split = self.splits[split]
        try:
            with _own_temp_folder():
                dataset, info = tfds.load(
                    self.dataset_name,
                    split=tfds_split,
                    data_dir=self.data_dir,
                    download=False,
                    with_info=True,
                )
        except (AssertionError, FileNotFoundError, ValueError) as e:
            raise UserError(
                f"TFDS dataset {self.dataset_name} (split {tfds_split}) cannot be read "
                f"from {self._where()}: {_first_sentence(e)} Prepare it first, e.g. "
                f"`tfds build {self.dataset_name} --data_dir=DIR` (with --manual_dir "
                f"for manual downloads), then give tfds_data_dir=DIR."
            ) from None
        split_info = info.splits.get(tfds_split)
        self._sizes[split] = split_info.num_examples if split_info else None
        return dataset, info

    def size(self, split):
        return self._sizes.get(split) or None

    def pairs(self, split):
        source_key, target_key = self.keys
        dataset = without_autotuning(self._load(split).prefetch(1024))
        for index, example in enumerate(dataset.as_numpy_iterator()):
            yield (
                _text(example[source_key], self.dataset_name, split, index),
                _text(example[target_key], self.dataset_name, split, index),
            )


def _first_sentence(error):
    text = " ".join(str(error).split())
    return (text.split(". ")[0].rstrip(".") + ".") if text else type(error).__name__


def _text(value, dataset_name, split, index):
    try:
        return value.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise UserError(
            f"TFDS {dataset_name} {split} example {index}: not valid UTF-8 ({e.reason})."
        ) from None


class TfdsTranslateProblem(TextProblem):
    """A translation problem whose text comes from a TFDS dataset (see module doc)."""

    default_vocab_size = 32000  # T2T's translate_*_wmt32k
    tfds_name = source_key = target_key = None
    tfds_splits = _WMT

    def corpus(self, config):
        reject_options(
            self.name, config, FILE_OPTIONS, f"it reads TFDS {self.tfds_name}"
        )
        return TfdsCorpus(
            self.tfds_name, self.source_key, self.target_key, self.tfds_splits, config
        )


def _make_problem_class(name, spec):
    dataset_name, source_key, target_key, splits = spec
    return type(
        "".join(part.capitalize() for part in name.split("_")),
        (TfdsTranslateProblem,),
        {
            "name": name,
            "tfds_name": dataset_name,
            "source_key": source_key,
            "target_key": target_key,
            "tfds_splits": splits,
            "__doc__": f"{source_key} → {target_key} from TFDS {dataset_name}.",
        },
    )


PROBLEM_CLASSES = tuple(
    _make_problem_class(name, spec) for name, spec in TFDS_TRANSLATE.items()
)
