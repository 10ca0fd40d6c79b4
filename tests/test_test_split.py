"""A test split: t2t-datagen --test_source/--test_target (and the
TFDS and numbers problems' own test splits), t2t-trainer --eval_use_test_set, and
t2t-decoder --eval_use_test_set writing RUN/decode.test.txt with BLEU/chrF.

Three data dirs share the training and dev files (so one vocabulary, one run):
"old" has no test split (the layout before test splits existed), "test" has other
numbers as test, "perm" has the dev pairs in reverse order as test. Metrics over a
whole split do not depend on its order, so "perm"'s test metrics must equal the dev
metrics, while "test"'s must differ."""

import json
import os
import re
import types

import pytest
import tensorflow_datasets as tfds
from support.cli_helpers import assert_user_error, run_cli, tiny_trainer_flags

from t2t_lite import registry
from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import (
    NumbersCorpus,
    TranslateNumbersEnFr,
    write_numbers_files,
)
from t2t_lite.data.tfds_problems import TfdsCorpus
from t2t_lite.decoding.bleu import corpus_scores, read_lines
from t2t_lite.errors import UserError

PROBLEM = "translate_parallel_text"
TEST_LINES = 40


def quiet(_):
    pass


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    for name, size, seed in (("train", 600, 1), ("dev", 40, 2), ("test", 40, 3)):
        write_numbers_files(
            str(root / f"{name}.en"), str(root / f"{name}.fr"), size, seed
        )
    for side in ("en", "fr"):  # the dev pairs, last first
        lines = (root / f"dev.{side}").read_text().splitlines(keepends=True)
        (root / f"perm.{side}").write_text("".join(reversed(lines)))
    return root


def datagen_args(root, data_dir, test=None):
    args = [
        f"--problem={PROBLEM}",
        f"--data_dir={data_dir}",
        "--vocab_size=100",
        "--num_shards=2",
        f"--train_source={root / 'train.en'}",
        f"--train_target={root / 'train.fr'}",
        f"--dev_source={root / 'dev.en'}",
        f"--dev_target={root / 'dev.fr'}",
    ]
    if test:
        args += [f"--test_source={root / test}.en", f"--test_target={root / test}.fr"]
    return args


def manifest(data_dir):
    with open(os.path.join(data_dir, f"{PROBLEM}.manifest.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def data_dirs(corpus, tmp_path_factory):
    dirs, outputs = {}, {}
    for name, test in (("old", None), ("test", "test"), ("perm", "perm")):
        dirs[name] = str(tmp_path_factory.mktemp(name))
        result = run_cli("datagen", *datagen_args(corpus, dirs[name], test))
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[name] = result.stdout
    fingerprints = {m["vocab"]["fingerprint"] for m in map(manifest, dirs.values())}
    assert len(fingerprints) == 1  # the vocabulary is trained on train only
    return dirs, outputs


def test_datagen_writes_the_test_split_like_dev(corpus, data_dirs):
    dirs, outputs = data_dirs
    assert f"test: {TEST_LINES} examples written" in outputs["test"]
    assert "test:" not in outputs["old"]
    splits = manifest(dirs["test"])["splits"]
    assert splits["test"]["examples"] == TEST_LINES
    assert splits["test"]["shards"] == [f"{PROBLEM}-test-00000-of-00001"]
    for side, ext in (("source", "en"), ("target", "fr")):
        kept = os.path.join(dirs["test"], splits["test"]["text"][side])
        assert read_lines(kept) == read_lines(str(corpus / f"test.{ext}"))
    problem = registry.PROBLEMS.get(PROBLEM)()
    problem.load(dirs["test"])
    targets = [
        problem.decode(ex["targets"])
        for ex in problem.dataset("test", dirs["test"]).as_numpy_iterator()
    ]
    assert targets == read_lines(str(corpus / "test.fr"))
    assert problem.split_text("test")[1] == targets
    # The old layout: no test entry, no test files, and a clear refusal to read one.
    assert "test" not in manifest(dirs["old"])["splits"]
    assert not [n for n in os.listdir(dirs["old"]) if "-test" in n]
    old = registry.PROBLEMS.get(PROBLEM)()
    old.load(dirs["old"])
    assert not old.has_split("test") and old.has_split("dev")
    with pytest.raises(UserError, match="has no test split") as error:
        old.dataset("test", dirs["old"])
    assert "\n" not in str(error.value)


def test_adding_test_files_to_old_data_is_refused(corpus, data_dirs):
    dirs, _ = data_dirs
    before = manifest(dirs["old"])
    result = run_cli("datagen", *datagen_args(corpus, dirs["old"], "test"))
    assert_user_error(result, "t2t-datagen", "without a test split", "overwrite")
    assert manifest(dirs["old"]) == before


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("no_target", ("test_source lists 1 file(s) but test_target lists 0",)),
        ("missing", ("nosuch.fr: no such file",)),
        ("empty", ("empty.fr is empty",)),
        ("short", ("short.fr has 39 lines but", f"has {TEST_LINES}")),
    ],
)
def test_bad_test_files_are_one_line_errors(corpus, tmp_path, case, fragments):
    (tmp_path / "empty.fr").write_text("")
    lines = (corpus / "test.fr").read_text().splitlines(keepends=True)
    (tmp_path / "short.fr").write_text("".join(lines[:-1]))
    target = {
        "missing": tmp_path / "nosuch.fr",
        "empty": tmp_path / "empty.fr",
        "short": tmp_path / "short.fr",
    }
    args = datagen_args(corpus, str(tmp_path / "data"))
    args.append(f"--test_source={corpus / 'test.en'}")
    if case != "no_target":
        args.append(f"--test_target={target[case]}")
    assert_user_error(run_cli("datagen", *args), "t2t-datagen", *fragments)
    assert not (tmp_path / "data").exists() or not os.listdir(tmp_path / "data")


def test_numbers_test_split_is_new_numbers_and_leaves_dev_alone():
    with_test = NumbersCorpus(2000, 300, 4, seed=1, test_size=300)
    without = NumbersCorpus(2000, 300, 4, seed=1)
    assert with_test.numbers("dev") == without.numbers("dev")
    assert with_test.numbers("train") == without.numbers("train")
    test = with_test.numbers("test")
    assert len(set(test)) == 300 and with_test.has_test_split()
    assert not set(test) & (
        set(with_test.numbers("train")) | set(without.numbers("dev"))
    )
    assert not without.has_test_split()


def test_numbers_data_from_before_test_splits_is_kept(tmp_path):
    data_dir, logged = str(tmp_path), []
    config = datagen.DatagenConfig(num_shards=1)
    datagen.generate(
        TranslateNumbersEnFr(300, 30, test_size=0), data_dir, config=config, log=quiet
    )
    before = sorted(os.listdir(data_dir))
    summary = datagen.generate(
        TranslateNumbersEnFr(300, 30), data_dir, config=config, log=logged.append
    )
    assert summary["skipped"] and "test" not in summary["splits"]
    assert "without a test split" in logged[-1]
    assert sorted(os.listdir(data_dir)) == before
    config.overwrite = True
    summary = datagen.generate(
        TranslateNumbersEnFr(300, 30), data_dir, config=config, log=quiet
    )
    assert summary["splits"]["test"]["examples"] == 30


def _mock_texts(name, split, keys, data_dir):
    texts = [
        (ex[keys[0]].decode(), ex[keys[1]].decode())
        for ex in tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir))
    ]
    return [(s.strip(), t.strip()) for s, t in texts if s.strip() and t.strip()]


def test_tfds_problem_takes_the_datasets_test_split(tmp_path):
    problem = registry.PROBLEMS.get("translate_wmt14_en_de")()
    assert problem.tfds_splits["test"] == "test"  # newstest2014
    config = datagen.DatagenConfig(
        vocab_size=16, num_shards=1, tfds_data_dir=str(tmp_path / "tfds")
    )
    data_dir = str(tmp_path / "data")
    with tfds.testing.mock_data(num_examples=60):
        summary = datagen.generate(problem, data_dir, config=config, log=quiet)
        expected = _mock_texts(
            "wmt14_translate/de-en", "test", ("en", "de"), str(tmp_path)
        )
    assert summary["splits"]["test"]["examples"] == len(expected)
    loaded = registry.PROBLEMS.get("translate_wmt14_en_de")()
    loaded.load(data_dir)
    sources, references = loaded.split_text("test")
    assert list(zip(sources, references)) == expected


def test_tfds_dataset_without_a_test_split_writes_none(tmp_path, monkeypatch):
    original = TfdsCorpus._load_with_info

    def without_test(self, split):  # info lists train and validation only
        dataset, _ = original(self, split)
        splits = {"train": None, "validation": None}
        return dataset, types.SimpleNamespace(splits=splits)

    monkeypatch.setattr(TfdsCorpus, "_load_with_info", without_test)
    problem = registry.PROBLEMS.get("translate_ted_pt_en")()
    config = datagen.DatagenConfig(
        vocab_size=14, num_shards=1, tfds_data_dir=str(tmp_path / "tfds")
    )
    logged = []
    with tfds.testing.mock_data(num_examples=60):
        summary = datagen.generate(
            problem, str(tmp_path / "data"), config=config, log=logged.append
        )
    assert sorted(summary["splits"]) == ["dev", "train"]
    assert any("has no test split" in line for line in logged)


# --- training and decoding ------------------------------------------------------------

DECODE = "beam_size=1,extra_length=8"  # greedy and short: an 8-step model rambles
TRAIN = [
    *tiny_trainer_flags(PROBLEM),
    "--train_steps=8",
    "--eval_steps=0",  # the whole split: metrics independent of its order
    "--local_eval_frequency=0",
    f"--eval_decode_hparams={DECODE}",
]
_FINAL = re.compile(
    r"Final eval at step 8 \(update \d+\): loss ([\d.]+), accuracy ([\d.]+), "
    r"sequence_accuracy ([\d.]+), BLEU ([\d.]+)"
)


def final_eval(stdout):
    match = _FINAL.search(stdout)
    assert match, stdout[-2000:]
    return [float(x) for x in match.groups()]


@pytest.fixture(scope="module")
def run_dir(data_dirs, tmp_path_factory):
    """Trained on the old layout (no test split): it must keep working."""
    out = str(tmp_path_factory.mktemp("run"))
    dirs, _ = data_dirs
    result = run_cli(
        "trainer", *TRAIN, f"--data_dir={dirs['old']}", f"--output_dir={out}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, final_eval(result.stdout)


@pytest.mark.slow
def test_eval_use_test_set_evaluates_the_test_split(data_dirs, run_dir):
    dirs, _ = data_dirs
    out, dev = run_dir
    with open(os.path.join(out, "metrics.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    assert "eval_split" not in last and last["loss"] == pytest.approx(dev[0], abs=1e-4)
    results = {}
    for name in ("test", "perm"):  # already trained to step 8: evaluates only
        result = run_cli(
            "trainer",
            *TRAIN,
            f"--data_dir={dirs[name]}",
            f"--output_dir={out}",
            "--eval_use_test_set",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        results[name] = final_eval(result.stdout)
    # The dev pairs in another order: same loss, accuracies and BLEU as dev.
    assert results["perm"] == pytest.approx(dev, abs=2e-4)
    # Other sentences: another loss (the test split was really read).
    assert abs(results["test"][0] - dev[0]) > 1e-3


@pytest.mark.slow
def test_old_data_refuses_eval_use_test_set_in_one_line(data_dirs, run_dir, tmp_path):
    dirs, _ = data_dirs
    out, _ = run_dir
    for output_dir in (out, str(tmp_path / "new_run")):
        before = sorted(os.listdir(out))
        result = run_cli(
            "trainer",
            *TRAIN,
            f"--data_dir={dirs['old']}",
            f"--output_dir={output_dir}",
            "--eval_use_test_set",
        )
        assert_user_error(result, "t2t-trainer", "has no test split", dirs["old"])
        assert sorted(os.listdir(out)) == before
    assert not os.path.exists(tmp_path / "new_run")
    result = run_cli(
        "trainer",
        "--problem=algorithmic_reverse",
        "--hparams_set=transformer_test",
        f"--output_dir={tmp_path / 'algo'}",
        "--eval_use_test_set",
    )
    assert_user_error(result, "t2t-trainer", "algorithmic_reverse has no test split")


@pytest.mark.slow
def test_decoder_decodes_and_scores_the_test_split(corpus, data_dirs, run_dir):
    dirs, _ = data_dirs
    out, _ = run_dir
    result = run_cli(
        "decoder",
        f"--output_dir={out}",
        f"--data_dir={dirs['test']}",
        f"--decode_hparams={DECODE}",
        "--eval_use_test_set",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    written = os.path.join(out, "decode.test.txt")
    hypotheses = read_lines(written)
    assert len(hypotheses) == TEST_LINES
    assert not os.path.exists(os.path.join(out, "decode.dev.txt"))
    scores = corpus_scores(hypotheses, read_lines(str(corpus / "test.fr")))
    assert f"BLEU = {scores.bleu:.2f}" in result.stdout
    assert f"chrF = {scores.chrf:.2f}" in result.stdout
    # The same greedy decoding as the trainer's test BLEU.
    again = run_cli(
        "trainer",
        *TRAIN,
        f"--data_dir={dirs['test']}",
        f"--output_dir={out}",
        "--eval_use_test_set",
    )
    assert final_eval(again.stdout)[3] == pytest.approx(scores.bleu, abs=0.01)


@pytest.mark.slow
def test_decoder_test_split_bad_input(data_dirs, run_dir, tmp_path):
    dirs, _ = data_dirs
    out, _ = run_dir
    result = run_cli(
        "decoder",
        f"--output_dir={out}",
        f"--data_dir={dirs['old']}",
        "--eval_use_test_set",
    )
    assert_user_error(result, "t2t-decoder", "has no test split")
    source = tmp_path / "in.en"
    source.write_text("one\n")
    result = run_cli(
        "decoder",
        f"--output_dir={out}",
        f"--data_dir={dirs['test']}",
        f"--decode_from_file={source}",
        "--eval_use_test_set",
    )
    assert_user_error(result, "t2t-decoder", "--eval_use_test_set")
