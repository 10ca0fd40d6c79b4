"""SentencePiece subword vocabularies: trained by t2t-datagen, stored in data_dir.

Ids follow the project's convention: 0 is padding, 1 is end of sequence (EOS), 2 is
SentencePiece's unknown piece, real pieces start at 3; there is no BOS. A vocabulary
is one `.model` file (SentencePiece's serialized ModelProto); its SHA-256 is the
vocabulary's identity: a checkpoint records it and refuses another one.
"""

import hashlib
import io
import os
import re

import numpy as np
import sentencepiece as spm

from t2t_lite.constants import EOS_ID, PAD_ID
from t2t_lite.errors import UserError, first_line
from t2t_lite.fileio import write_atomically

UNK_ID = 2
_MIN_VOCAB_SIZE = 4  # pad, EOS, unk and at least one piece
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\).*<= (\d+)")


class VocabError(UserError):
    """A vocabulary that cannot be trained or used; str() names the file."""


def train_sentencepiece(
    sentences,
    path,
    vocab_size,
    *,
    character_coverage=1.0,
    sample_size=1_000_000,
    model_type="unigram",
    seed=1,
):
    """Trains a SentencePiece model on an iterable of sentences; writes it to `path`.

    `sample_size` sentences at most are used (SentencePiece samples them uniformly from
    the iterable); every sentence is read. Returns the loaded SubwordVocab.
    """
    if vocab_size < _MIN_VOCAB_SIZE:
        raise VocabError(f"vocab_size must be >= {_MIN_VOCAB_SIZE}, got {vocab_size}.")
    writer = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=writer,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=sample_size,
            shuffle_input_sentence=True,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise _training_error(e, path, vocab_size) from None
    write_atomically(path, writer.getvalue())
    vocab = SubwordVocab(path, writer.getvalue())
    _write_piece_list(vocab, path)
    return vocab


def _training_error(error, path, vocab_size):
    too_high = _TOO_HIGH.search(str(error))
    if too_high:
        most = too_high.group(2)
        return VocabError(
            f"vocab_size={vocab_size} is too large for the training text of "
            f"{os.path.basename(path)}: SentencePiece can make at most {most} pieces "
            f"from it; use vocab_size={most} or less, or more text."
        )
    return VocabError(f"SentencePiece training for {path} failed: {first_line(error)}")


def _write_piece_list(vocab, model_path):
    """A human-readable `<name>.vocab` next to the model: id, piece, one per line."""
    listing = "".join(
        f"{i}\t{vocab.id_to_piece(i)}\n" for i in range(vocab.size)
    ).encode("utf-8")
    write_atomically(os.path.splitext(model_path)[0] + ".vocab", listing)


class SubwordVocab:
    """A loaded SentencePiece model: text ↔ ids with the project's id convention."""

    def __init__(self, path, model_bytes=None):
        self.path = path
        if model_bytes is None:
            model_bytes = _read_model(path)
        self.sha256 = hashlib.sha256(model_bytes).hexdigest()
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model_bytes)
        except (RuntimeError, OSError):
            raise VocabError(f"{path} is not a SentencePiece model.") from None
        if (self._sp.pad_id(), self._sp.eos_id()) != (PAD_ID, EOS_ID):
            raise VocabError(
                f"{path} uses pad id {self._sp.pad_id()} and EOS id "
                f"{self._sp.eos_id()}, t2t_lite needs {PAD_ID} and {EOS_ID}."
            )

    @property
    def size(self):
        return self._sp.get_piece_size()

    def id_to_piece(self, token_id):
        return self._sp.id_to_piece(int(token_id))

    def encode(self, texts, num_threads=-1):
        """List of strings → list of id lists, each ending with EOS."""
        return self._sp.encode(list(texts), add_eos=True, num_threads=num_threads)

    def encode_one(self, text):
        return self._sp.encode(text, add_eos=True)

    def decode(self, ids):
        """Ids → text: stops at EOS, skips padding; out-of-range ids decode as unk."""
        ids = np.asarray(ids).reshape(-1).tolist()
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        ids = [i if 0 <= i < self.size else UNK_ID for i in ids if i != PAD_ID]
        return self._sp.decode(ids)


def _read_model(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise VocabError(f"{path}: vocabulary file not found.") from None
    except OSError as e:
        raise VocabError(f"{path}: cannot be read ({e.strerror}).") from None
