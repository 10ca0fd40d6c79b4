"""t2t-datagen's library on small generated parallel files: shards + vocab + manifest,
round trip back to the text, idempotent re-runs, interrupted runs, options."""

import collections
import gzip
import os
import shutil

import pytest

from t2t_lite.data import datagen, datagen_report, tfrecords
from t2t_lite.data.numbers_problem import write_numbers_files
from t2t_lite.data.text_problems import TranslateParallelText
from t2t_lite.data.vocab import train_sentencepiece
from t2t_lite.errors import UserError

EXTRA = [("", "rien"), ("Ça coûte 3,50 €, n'est-ce pas ?", "It costs 3.50 €, right?")]
NAME = TranslateParallelText.name


def quiet(_):
    pass


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    paths = {k: str(d / k) for k in ("train.en.gz", "train.fr", "dev.en", "dev.fr")}
    write_numbers_files(paths["train.en.gz"], paths["train.fr"], 3000, seed=1)
    with gzip.open(paths["train.en.gz"], "at", encoding="utf-8") as f:
        f.writelines(f"{s}\n" for s, _ in EXTRA)
    with open(paths["train.fr"], "a", encoding="utf-8") as f:
        f.writelines(f"{t}\n" for _, t in EXTRA)
    write_numbers_files(paths["dev.en"], paths["dev.fr"], 200, seed=2)
    return paths


def config_for(files, **overrides):
    settings = {
        "vocab_size": 120,
        "num_shards": 3,
        "train_source": (files["train.en.gz"],),
        "train_target": (files["train.fr"],),
        "dev_source": (files["dev.en"],),
        "dev_target": (files["dev.fr"],),
    }
    settings.update(overrides)
    return datagen.DatagenConfig(**settings)


def read_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def text_pairs(files, split):
    return list(
        zip(
            read_lines(files[f"{split}.en" + (".gz" if split == "train" else "")]),
            read_lines(files[f"{split}.fr"]),
        )
    )


def decoded(problem, data_dir, split):
    dataset = problem.dataset(split, data_dir)
    return [
        (problem.decode_inputs(ex["inputs"]), problem.decode(ex["targets"]))
        for ex in dataset.as_numpy_iterator()
    ]


@pytest.fixture(scope="module")
def generated(files, tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("data"))
    summary = datagen.generate(
        TranslateParallelText(), data_dir, config=config_for(files), log=quiet
    )
    return data_dir, summary


def test_writes_shards_vocab_and_manifest_with_summary(generated):
    data_dir, summary = generated
    names = sorted(os.listdir(data_dir))
    assert names == sorted(
        [f"{NAME}-train-0000{i}-of-00003" for i in range(3)]
        + [f"{NAME}-dev-00000-of-00001", f"{NAME}-dev.source.txt"]
        + [f"{NAME}-dev.target.txt", f"{NAME}.manifest.json"]
        + [f"{NAME}.vocab.model", f"{NAME}.vocab.vocab"]
    )
    train, dev = summary["splits"]["train"], summary["splits"]["dev"]
    assert train["examples"] == 3001 and dev["examples"] == 200
    manifest = tfrecords.read_manifest(data_dir, NAME)
    assert sum(manifest["splits"]["train"]["shard_examples"]) == 3001
    assert manifest["splits"]["dev"]["shard_examples"] == [200]
    assert (
        manifest["vocab"]["sha256"]["source"] == manifest["vocab"]["sha256"]["target"]
    )
    assert train["dropped"] == {datagen.DROP_EMPTY: 1} and dev["dropped"] == {}
    assert summary["vocab_size"] == 120
    p = train["tokens_per_example"]["targets"]
    assert 2 <= p["p50"] <= p["p90"] <= p["p99"] <= p["max"]
    lines = datagen_report.summary_lines(summary, data_dir)
    assert any(
        "train: 3001 examples written; dropped: 1 empty" in line for line in lines
    )


def test_round_trip_to_the_original_text(files, generated):
    data_dir, _ = generated
    problem = TranslateParallelText()
    problem.load(data_dir)
    assert problem.vocab_size == 120
    assert problem.vocab_fingerprint().startswith("sentencepiece:shared:120/120:")
    expected_train = [(s, t) for s, t in text_pairs(files, "train") if s and t]
    assert collections.Counter(decoded(problem, data_dir, "train")) == (
        collections.Counter(expected_train)
    )
    assert decoded(problem, data_dir, "dev") == text_pairs(files, "dev")  # in order
    assert read_lines(os.path.join(data_dir, f"{NAME}-dev.target.txt")) == read_lines(
        files["dev.fr"]
    )
    for ex in problem.dataset("train", data_dir).take(50).as_numpy_iterator():
        for ids in ex.values():
            assert ids[-1] == 1 and 0 not in ids and 1 not in ids[:-1]


def test_rerun_with_same_inputs_does_nothing(files, generated):
    data_dir, _ = generated
    before = {
        n: os.stat(os.path.join(data_dir, n)).st_mtime_ns for n in os.listdir(data_dir)
    }
    messages = []
    summary = datagen.generate(
        TranslateParallelText(), data_dir, config=config_for(files), log=messages.append
    )
    assert summary["skipped"] and "nothing to do" in messages[-1]
    after = {
        n: os.stat(os.path.join(data_dir, n)).st_mtime_ns for n in os.listdir(data_dir)
    }
    assert after == before


def test_other_settings_are_refused_unless_overwrite(files, generated, tmp_path):
    data_dir = str(tmp_path / "copy")
    shutil.copytree(generated[0], data_dir)
    problem = TranslateParallelText()
    with pytest.raises(
        UserError, match=r"other inputs or settings.*vocab_size: 120 then"
    ):
        datagen.generate(problem, data_dir, config=config_for(files, vocab_size=100))
    config = config_for(files, vocab_size=100, num_shards=2, overwrite=True)
    summary = datagen.generate(problem, data_dir, config=config, log=quiet)
    assert summary["vocab_size"] == 100 and not summary.get("skipped")
    shards = [n for n in os.listdir(data_dir) if "-train-" in n]
    assert sorted(shards) == [f"{NAME}-train-0000{i}-of-00002" for i in range(2)]
    problem.load(data_dir)
    assert problem.vocab_size == 100


def test_bad_input_on_overwrite_keeps_the_old_data(files, generated, tmp_path):
    data_dir = str(tmp_path / "copy")
    shutil.copytree(generated[0], data_dir)
    short = str(tmp_path / "short.fr")
    with open(short, "w") as f:
        f.write("un\n")
    config = config_for(files, dev_target=(short,), overwrite=True)
    with pytest.raises(UserError, match=r"short\.fr has 1 lines"):
        datagen.generate(TranslateParallelText(), data_dir, config=config, log=quiet)
    assert sorted(os.listdir(data_dir)) == sorted(os.listdir(generated[0]))
    TranslateParallelText().load(data_dir)


def test_progress_lines(files, tmp_path):
    messages = []
    config = config_for(files, log_every=1000, num_shards=1)
    datagen.generate(
        TranslateParallelText(), str(tmp_path), config=config, log=messages.append
    )
    progress = [m for m in messages if m.startswith("train: ")]
    assert len(progress) == 2 and progress[0].startswith("train: 2000/3002 (67%), ")
    assert "pairs/s" in progress[0] and "ETA" in progress[0]


def test_interrupted_run_never_reads_as_valid(files, tmp_path, monkeypatch):
    data_dir = str(tmp_path / "data")
    calls = []

    def crash_after_1000(*args):
        calls.append(1)
        if len(calls) > 1000:
            raise KeyboardInterrupt
        return serialize(*args)

    serialize = tfrecords.serialize_example
    monkeypatch.setattr(tfrecords, "serialize_example", crash_after_1000)
    with pytest.raises(KeyboardInterrupt):
        datagen.generate(
            TranslateParallelText(), data_dir, config=config_for(files), log=quiet
        )
    monkeypatch.undo()
    assert not [n for n in os.listdir(data_dir) if ".tmp-" in n]  # cleaned up
    # A killed run leaves temporaries and some finished shards, but no manifest.
    for name in (f"{NAME}-train-00000-of-00003", f"{NAME}-train-00001-of-00003.tmp-99"):
        open(os.path.join(data_dir, name), "wb").close()
    with pytest.raises(UserError, match=r"incomplete \(interrupted t2t-datagen"):
        TranslateParallelText().load(data_dir)
    summary = datagen.generate(
        TranslateParallelText(), data_dir, config=config_for(files), log=quiet
    )
    assert summary["splits"]["train"]["examples"] == 3001
    assert not [n for n in os.listdir(data_dir) if ".tmp-" in n]


def test_separate_vocabularies(files, tmp_path):
    data_dir = str(tmp_path / "data")
    config = config_for(files, shared_vocab=False, vocab_size=60, num_shards=1)
    datagen.generate(TranslateParallelText(), data_dir, config=config, log=quiet)
    assert os.path.exists(os.path.join(data_dir, f"{NAME}.vocab.source.model"))
    assert os.path.exists(os.path.join(data_dir, f"{NAME}.vocab.target.model"))
    problem = TranslateParallelText()
    problem.load(data_dir)
    assert problem.vocab_size == 60
    assert problem.source_vocab.sha256 != problem.target_vocab.sha256
    assert problem.vocab_fingerprint().startswith("sentencepiece:separate:60/60:")
    assert decoded(problem, data_dir, "dev")[:20] == text_pairs(files, "dev")[:20]


def test_dev_held_out_of_train_without_dev_files(files, tmp_path):
    data_dir = str(tmp_path / "data")
    config = config_for(files, dev_source=(), dev_target=(), dev_holdout=100)
    summary = datagen.generate(
        TranslateParallelText(), data_dir, config=config, log=quiet
    )
    train, dev = summary["splits"]["train"], summary["splits"]["dev"]
    dropped = sum(train["dropped"].values()) + sum(dev["dropped"].values())
    assert dev["examples"] + ((dev["dropped"] and 1) or 0) == 100
    assert train["examples"] + dev["examples"] + dropped == 3002
    problem = TranslateParallelText()
    problem.load(data_dir)
    everything = collections.Counter(decoded(problem, data_dir, "train"))
    everything.update(decoded(problem, data_dir, "dev"))
    assert everything == collections.Counter(
        (s, t) for s, t in text_pairs(files, "train") if s and t
    )


def test_max_length_and_max_examples(files, tmp_path):
    data_dir = str(tmp_path / "data")
    config = config_for(
        files, max_length=6, max_examples=500, num_shards=1, vocab_size=60
    )
    summary = datagen.generate(
        TranslateParallelText(), data_dir, config=config, log=quiet
    )
    train = summary["splits"]["train"]
    too_long = train["dropped"][datagen.DROP_TOO_LONG]
    assert train["examples"] + too_long == 500
    assert train["tokens_per_example"]["inputs"]["max"] <= 6
    problem = TranslateParallelText()
    problem.load(data_dir)
    lengths = [
        max(len(ex["inputs"]), len(ex["targets"]))
        for ex in problem.dataset("train", data_dir).as_numpy_iterator()
    ]
    assert len(lengths) == train["examples"] and max(lengths) <= 6


def test_load_errors_name_the_data_dir_and_the_fix(files, generated, tmp_path):
    problem = TranslateParallelText()
    with pytest.raises(UserError, match="reads its data from data_dir"):
        problem.load(None)
    with pytest.raises(UserError, match="does not exist; run t2t-datagen"):
        problem.load(str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match=f"{NAME}.manifest.json not found: no data"):
        problem.load(str(tmp_path))
    data_dir = str(tmp_path / "copy")
    shutil.copytree(generated[0], data_dir)
    os.remove(os.path.join(data_dir, f"{NAME}-train-00001-of-00003"))
    problem.load(data_dir)
    with pytest.raises(
        UserError, match=r"train-00001-of-00003 is listed in .* but missing"
    ):
        problem.dataset("train", data_dir)
    vocab_path = os.path.join(data_dir, f"{NAME}.vocab.model")
    train_sentencepiece(  # another vocabulary under the same name: refused
        [s for pair in text_pairs(files, "dev") for s in pair], vocab_path, 50
    )
    with pytest.raises(UserError, match=r"vocab\.model was changed after t2t-datagen"):
        TranslateParallelText().load(data_dir)
    with open(vocab_path, "wb") as f:
        f.write(b"garbage")
    with pytest.raises(UserError, match="not a SentencePiece model; run t2t-datagen"):
        TranslateParallelText().load(data_dir)
