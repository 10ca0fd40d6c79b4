"""TFDS translation problems, with tfds.testing.mock_data: never the network."""

import collections
import os
import tempfile

import pytest
import tensorflow_datasets as tfds

from t2t_lite import registry
from t2t_lite.data import datagen
from t2t_lite.data.tfds_problems import TfdsTranslateProblem
from t2t_lite.errors import UserError


def quiet(_):
    pass


def test_registered_by_name():
    for name in (
        "translate_wmt14_en_de",
        "translate_wmt14_de_en",
        "translate_ted_pt_en",
    ):
        problem = registry.PROBLEMS.get(name)()
        assert isinstance(problem, TfdsTranslateProblem)
    problem = registry.PROBLEMS.get("translate_wmt14_de_en")()
    assert (problem.tfds_name, problem.source_key, problem.target_key) == (
        "wmt14_translate/de-en",
        "de",
        "en",
    )


def test_datagen_from_mocked_tfds_round_trips(tmp_path):
    problem = registry.PROBLEMS.get("translate_wmt14_de_en")()
    config = datagen.DatagenConfig(
        vocab_size=16, num_shards=2, tfds_data_dir=str(tmp_path / "tfds")
    )
    data_dir = str(tmp_path / "data")
    with tfds.testing.mock_data(num_examples=300):
        summary = datagen.generate(problem, data_dir, config=config, log=quiet)
        texts = [
            (ex["de"].decode(), ex["en"].decode())
            for ex in tfds.as_numpy(
                tfds.load(
                    "wmt14_translate/de-en", split="validation", data_dir=str(tmp_path)
                )
            )
        ]
    kept = [
        (" ".join(s.split()), " ".join(t.split()))
        for s, t in texts
        if s.strip() and t.strip()
    ]
    assert summary["splits"]["train"]["examples"] == len(kept)
    assert summary["splits"]["dev"]["examples"] == len(kept)
    loaded = registry.PROBLEMS.get("translate_wmt14_de_en")()
    loaded.load(data_dir)  # training reads the TFRecords, not TFDS
    assert loaded.vocab_size == 16
    dev = [
        (loaded.decode_inputs(ex["inputs"]), loaded.decode(ex["targets"]))
        for ex in loaded.dataset("dev", data_dir).as_numpy_iterator()
    ]
    assert dev == kept  # mock text is a-j and spaces: all covered by the vocab
    train = collections.Counter(
        loaded.decode(ex["targets"])
        for ex in loaded.dataset("train", data_dir).as_numpy_iterator()
    )
    assert train == collections.Counter(t for _, t in kept)


@pytest.fixture
def temp_folder(tmp_path, monkeypatch):
    """The temporary directory, watched: TFDS leaves a folder in it for every
    builder of a dataset not prepared yet, unless t2t_lite stops it."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_unprepared_dataset_is_a_clear_error(tmp_path, temp_folder):
    problem = registry.PROBLEMS.get("translate_wmt14_en_de")()
    config = datagen.DatagenConfig(tfds_data_dir=str(tmp_path / "empty_tfds"))
    with pytest.raises(UserError) as info:
        datagen.generate(problem, str(tmp_path / "data"), config=config, log=quiet)
    message = str(info.value)
    assert "wmt14_translate/de-en" in message and "empty_tfds" in message
    assert "tfds build" in message and "\n" not in message
    assert os.listdir(temp_folder) == []


def test_file_flags_are_refused(tmp_path):
    problem = registry.PROBLEMS.get("translate_wmt14_en_de")()
    config = datagen.DatagenConfig(train_source=("a",), train_target=("b",))
    with pytest.raises(UserError, match="train_source is not used by problem"):
        datagen.generate(problem, str(tmp_path), config=config, log=quiet)


def test_manual_dir_asks_tfds_to_prepare_first(tmp_path, monkeypatch, temp_folder):
    prepared = []

    def spy(self, *args, download_config=None, **kwargs):  # a no-op, as under mock
        del self, args, kwargs
        prepared.append(download_config.manual_dir)

    problem = registry.PROBLEMS.get("translate_ted_pt_en")()
    config = datagen.DatagenConfig(
        vocab_size=14, num_shards=1, tfds_manual_dir=str(tmp_path / "manual")
    )
    with tfds.testing.mock_data(num_examples=100):
        monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", spy)
        summary = datagen.generate(
            problem, str(tmp_path / "data"), config=config, log=quiet
        )
    assert [str(p) for p in prepared] == [str(tmp_path / "manual")]
    assert summary["splits"]["train"]["examples"] > 0
    assert os.listdir(temp_folder) == []
