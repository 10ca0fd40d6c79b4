"""SentencePiece vocabulary: id convention, EOS, round trip, clear errors."""

import os

import numpy as np
import pytest

from t2t_lite.data import numbers_problem
from t2t_lite.data.vocab import SubwordVocab, VocabError, train_sentencepiece
from t2t_lite.errors import UserError


def sentences(count=2000, seed=0):
    rng = np.random.default_rng(seed)
    numbers = numbers_problem.random_numbers(rng, count, 6).tolist()
    out = []
    for n in numbers:
        out.append(numbers_problem.english_words(n))
        out.append(numbers_problem.french_words(n))
    return out


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("vocab") / "v.model")
    return train_sentencepiece(sentences(), path, 80)


def test_ids_follow_the_project_convention(vocab):
    assert vocab.size == 80
    assert vocab.id_to_piece(0) == "<pad>"
    assert vocab.id_to_piece(1) == "</s>"
    assert vocab.id_to_piece(2) == "<unk>"
    for ids in vocab.encode(["deux cent mille", "zéro", "ninety-nine"]):
        assert ids[-1] == 1 and 1 not in ids[:-1] and 0 not in ids
        assert all(2 <= i < vocab.size for i in ids[:-1])


def test_round_trip_and_decode_stops_at_eos(vocab):
    for text in sentences(50, seed=1):
        ids = vocab.encode_one(text)
        assert vocab.decode(ids) == text
        assert vocab.decode(ids + [0, 0]) == text  # padding is ignored
        assert vocab.decode(ids + [5, 6, 1]) == text  # stops at the first EOS
    assert vocab.decode([vocab.size + 7]) != ""  # out of range: unk, no crash


def test_written_file_loads_with_same_hash_and_listing(vocab):
    loaded = SubwordVocab(vocab.path)
    assert loaded.sha256 == vocab.sha256 and loaded.size == vocab.size
    listing = os.path.splitext(vocab.path)[0] + ".vocab"
    with open(listing, encoding="utf-8") as f:
        assert f.readline() == "0\t<pad>\n"
    assert not [n for n in os.listdir(os.path.dirname(vocab.path)) if ".tmp" in n]


def test_too_large_vocab_is_a_clear_error(tmp_path):
    with pytest.raises(VocabError, match=r"vocab_size=5000 is too large.*at most \d+"):
        train_sentencepiece(sentences(200), str(tmp_path / "v.model"), 5000)
    assert not os.path.exists(tmp_path / "v.model")


def test_missing_and_corrupt_files_are_user_errors(tmp_path):
    missing = str(tmp_path / "missing.model")
    with pytest.raises(UserError, match=r"missing\.model: vocabulary file not found"):
        SubwordVocab(missing)
    corrupt = tmp_path / "corrupt.model"
    corrupt.write_bytes(b"not a model")
    with pytest.raises(UserError, match=r"corrupt\.model is not a SentencePiece model"):
        SubwordVocab(str(corrupt))
