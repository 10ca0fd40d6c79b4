"""Tests for t2t_lite.data.problems: determinism, correctness, vocabulary convention."""

import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.data import problems

ALL_PROBLEMS = (
    problems.AlgorithmicReverse,
    problems.AlgorithmicIdentity,
    problems.AlgorithmicAdditionDecimal,
)


def small(cls, **kwargs):
    return cls(train_size=300, dev_size=100, **kwargs)


@pytest.mark.parametrize("cls", ALL_PROBLEMS)
def test_same_seed_same_data_and_other_seed_differs(cls):
    assert small(cls).generate("train") == small(cls).generate("train")
    assert small(cls).generate("dev") == small(cls).generate("dev")
    assert small(cls, seed=7).generate("train") != small(cls).generate("train")


@pytest.mark.parametrize("cls", ALL_PROBLEMS)
def test_train_and_dev_differ_and_have_requested_sizes(cls):
    problem = small(cls)
    train, dev = problem.generate("train"), problem.generate("dev")
    assert len(train) == 300 and len(dev) == 100
    assert dev != train[:100]  # Not the same random stream.


@pytest.mark.parametrize("cls", ALL_PROBLEMS)
def test_vocabulary_convention(cls):
    problem = small(cls)
    for inputs, targets in problem.generate("train") + problem.generate("dev"):
        for seq in (inputs, targets):
            assert seq[-1] == problems.EOS_ID
            body = seq[:-1]
            assert body, "every sequence has at least one symbol before EOS"
            assert all(2 <= t < problem.vocab_size for t in body), seq


def test_reverse_and_identity_targets():
    reverse = problems.AlgorithmicReverse(train_size=500, dev_size=10, max_length=12)
    lengths = set()
    for inputs, targets in reverse.generate("train"):
        assert targets[:-1] == inputs[:-1][::-1]
        lengths.add(len(inputs) - 1)
    assert lengths == set(range(1, 13))  # 1..12 symbols, EOS not counted.
    identity = problems.AlgorithmicIdentity(train_size=200, dev_size=10)
    for inputs, targets in identity.generate("train"):
        assert targets == inputs
    assert reverse.name == "algorithmic_reverse"
    assert identity.name == "algorithmic_identity"
    assert reverse.vocab_size == identity.vocab_size == 12


def test_addition_arithmetic():
    problem = problems.AlgorithmicAdditionDecimal(train_size=1000, dev_size=10)
    assert problem.name == "algorithmic_addition_decimal"
    assert problem.vocab_size == 13
    digit_counts = set()
    for inputs, targets in problem.generate("train"):
        assert inputs.count(12) == 1  # Exactly one '+'.
        a_text, b_text = problem.decode(inputs).split("+")
        for text in (a_text, b_text):
            assert text == str(int(text))  # No leading zeros.
            digit_counts.add(len(text))
        assert int(problem.decode(targets)) == int(a_text) + int(b_text)
    assert digit_counts == {1, 2, 3, 4, 5}


def test_addition_ids_are_digits_most_significant_first():
    problem = problems.AlgorithmicAdditionDecimal()
    assert problem.decode([3, 4, 12, 11, 1]) == "12+9"
    flat, lengths = problem._strings_to_ids(["120+7"])
    assert flat.tolist() == [3, 4, 2, 12, 9] and lengths.tolist() == [5]


@pytest.mark.parametrize("cls", ALL_PROBLEMS)
def test_dataset_matches_generate(cls):
    problem = small(cls)
    dataset = problem.dataset("dev")
    for key in ("inputs", "targets"):
        assert dataset.element_spec[key] == tf.TensorSpec([None], tf.int32)
    got = [
        (ex["inputs"].tolist(), ex["targets"].tolist())
        for ex in dataset.as_numpy_iterator()
    ]
    assert got == problem.generate("dev")


def test_base_class_dataset_goes_through_generate():
    class Tiny(problems.Problem):
        name = "tiny"
        vocab_size = 5

        def generate(self, split):
            problems.check_split(split)
            return [([2, 3, 1], [4, 1]), ([4, 1], [2, 2, 3, 1])]

    got = [
        (ex["inputs"].tolist(), ex["targets"].tolist())
        for ex in Tiny().dataset("train").as_numpy_iterator()
    ]
    assert got == Tiny().generate("train")


def test_decode_stops_at_eos_and_skips_padding():
    problem = problems.AlgorithmicReverse()
    assert problem.decode([0, 2, 3, 0, 11, 1, 4, 5]) == "0 1 9"
    assert problem.decode(np.array([[4, 1, 0]])) == "2"
    assert problem.decode(tf.constant([5, 99])) == "3 <99>"
    assert problem.decode([]) == ""


@pytest.mark.parametrize("cls", ALL_PROBLEMS)
def test_bad_split_names_the_split(cls):
    problem = small(cls)
    for call in (problem.generate, problem.dataset):
        with pytest.raises(ValueError, match=r"'test'.*train.*dev"):
            call("test")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_symbols": 0},
        {"min_length": 0},
        {"min_length": 5, "max_length": 4},
        {"train_size": -1},
        {"seed": -3},
        {"num_symbols": 2.5},
    ],
)
def test_bad_constructor_arguments(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        problems.AlgorithmicReverse(**kwargs)
    with pytest.raises(ValueError, match="max_digits"):
        problems.AlgorithmicAdditionDecimal(max_digits=19)


def test_generation_makes_large_splits():
    # No time bound here (timings belong in benchmarks, not pass/fail tests): a
    # 100k-example split is generated whole (vectorized, ~0.6 s on 2 cores).
    for cls in ALL_PROBLEMS:
        data = cls(train_size=100000).generate("train")
        assert len(data) == 100000
        assert all(pair[0][-1] == 1 and pair[1][-1] == 1 for pair in data[:1000])
