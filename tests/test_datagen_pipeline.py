"""Token batching from TFRecord shards: every batch within the token budget and
max_length; across an epoch no example is lost or duplicated (counted)."""

import collections

import numpy as np
import pytest

from t2t_lite.data import datagen
from t2t_lite.data.numbers_problem import write_numbers_files
from t2t_lite.data.pipeline import make_dataset
from t2t_lite.data.text_problems import TranslateParallelText


@pytest.fixture(scope="module")
def problem_and_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    write_numbers_files(str(d / "a.en"), str(d / "a.fr"), 4000, seed=3, max_digits=9)
    config = datagen.DatagenConfig(
        vocab_size=100,
        num_shards=4,
        train_source=(str(d / "a.en"),),
        train_target=(str(d / "a.fr"),),
        dev_holdout=200,
    )
    data_dir = str(d / "data")
    datagen.generate(TranslateParallelText(), data_dir, config=config, log=lambda _: 0)
    problem = TranslateParallelText()
    problem.load(data_dir)
    return problem, data_dir


def as_key(ex):
    return tuple(ex["inputs"].tolist()), tuple(ex["targets"].tolist())


def unpad(row):
    row = row.tolist()
    while row and row[-1] == 0:
        row.pop()
    return tuple(row)


def all_examples(problem, data_dir):
    return collections.Counter(
        as_key(ex) for ex in problem.dataset("train", data_dir).as_numpy_iterator()
    )


@pytest.mark.parametrize(
    "batch_size, max_length, epochs", [(256, 24, 2), (97, 16, 1), (512, 0, 1)]
)
def test_batches_respect_budget_and_lose_nothing(
    problem_and_dir, batch_size, max_length, epochs
):
    problem, data_dir = problem_and_dir
    examples = all_examples(problem, data_dir)
    assert sum(examples.values()) == 3800
    limit = max_length or batch_size
    kept = collections.Counter(
        {k: n for k, n in examples.items() if max(map(len, k)) <= limit}
    )
    assert 0 < sum(kept.values())
    if max_length == 16:
        assert sum(kept.values()) < 3800  # the filter really removed some
    dataset = make_dataset(
        problem.dataset("train", data_dir),
        batch_size=batch_size,
        max_length=max_length,
        training=True,
        shuffle_buffer=1000,
        seed=5,
        repeat=epochs,
    )
    seen = collections.Counter()
    for batch in dataset.as_numpy_iterator():
        rows, width = (
            batch["inputs"].shape[0],
            max(batch["inputs"].shape[1], batch["targets"].shape[1]),
        )
        assert rows * width <= batch_size
        assert width <= limit
        for inputs, targets in zip(batch["inputs"], batch["targets"]):
            seen[(unpad(inputs), unpad(targets))] += 1
    assert seen == collections.Counter({k: epochs * n for k, n in kept.items()})


def test_training_order_is_shuffled_and_seeded(problem_and_dir):
    problem, data_dir = problem_and_dir

    def first_rows(seed):
        dataset = make_dataset(
            problem.dataset("train", data_dir),
            batch_size=256,
            max_length=32,
            training=True,
            seed=seed,
        )
        return [np.asarray(b["targets"]).tolist() for b in dataset.take(3)]

    assert first_rows(1) == first_rows(1)
    assert first_rows(1) != first_rows(2)


def test_dev_reads_in_corpus_order(problem_and_dir):
    problem, data_dir = problem_and_dir
    dev = [
        problem.decode(ex["targets"])
        for ex in problem.dataset("dev").as_numpy_iterator()
    ]
    with open(f"{data_dir}/{problem.name}-dev.target.txt", encoding="utf-8") as f:
        assert dev == [line.rstrip("\n") for line in f]
