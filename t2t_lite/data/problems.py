"""Problems: named sources of (inputs, targets) id sequences.

A Problem owns its vocabulary convention and its data. The built-in ones are T2T's
algorithmic family: they are generated in-process from a seed (no downloads, no files),
so a quick start, a test, or a benchmark can train on real sequence-to-sequence data in
seconds. Registration by name happens elsewhere (the registry imports this module);
nothing here imports the registry, so this file can be used and tested on its own.

Vocabulary convention (T2T): id 0 is padding, id 1 is end of sequence (EOS), symbols
start at id 2. Every generated sequence ends with EOS and never contains padding, so a
padded batch can always be unpadded by stripping trailing zeros.
"""

import numpy as np
import tensorflow as tf

from t2t_lite.constants import EOS_ID, PAD_ID
from t2t_lite.errors import UserError

NUM_RESERVED_IDS = 2  # pad and EOS; the first symbol is id 2.
SPLITS = ("train", "dev")  # what in-process problems generate (T2T's train and eval)
ALL_SPLITS = ("train", "dev", "test")  # test: only where t2t-datagen wrote one
_SPLIT_INDEX = {"train": 0, "dev": 1}  # Mixed into the seed: dev is a different draw.


def check_split(split, splits=SPLITS):
    """Returns `split` if it is one of `splits`; otherwise a one-line ValueError."""
    if split not in splits:
        raise ValueError(
            f"Unknown split {split!r}; expected one of {', '.join(splits)}."
        )
    return split


def _check_int(name, value, minimum, maximum=None):
    """Validates a constructor argument so a bad value fails here, not deep in numpy."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {value}.")
    return int(value)


def append_eos(flat, lengths):
    """Appends EOS to every segment of a flat (concatenated) sequence array.

    Works on the flat representation so that generating 100k examples stays a handful
    of numpy calls instead of 100k Python list operations.
    Returns (new_flat int32, new_lengths int64).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.full(flat.size + lengths.size, EOS_ID, dtype=np.int32)
    segment = np.repeat(np.arange(lengths.size), lengths)
    # Element p of segment k moves right by k: one EOS was inserted per earlier segment.
    out[np.arange(flat.size) + segment] = flat
    return out, lengths + 1


def _to_lists(flat, lengths):
    """Splits a flat array into a list of Python int lists (cheap slicing of one list)."""
    values = flat.tolist()
    ends = np.cumsum(lengths).tolist()
    starts = [0] + ends[:-1]
    return [values[s:e] for s, e in zip(starts, ends)]


def _ragged_dataset(inputs, targets):
    """Builds an unbatched dataset of {"inputs", "targets"} from (flat, lengths) pairs.

    from_tensor_slices over a RaggedTensor is fast (no Python generator, no per-element
    Python work). Its elements have a RaggedTensorSpec of ragged_rank 0, which
    `padded_batch` rejects, so an identity map turns the spec into a plain TensorSpec.
    """
    features = {
        name: tf.RaggedTensor.from_row_lengths(
            tf.constant(flat, tf.int32), tf.constant(lengths, tf.int64)
        )
        for name, (flat, lengths) in (("inputs", inputs), ("targets", targets))
    }
    dataset = tf.data.Dataset.from_tensor_slices(features)
    return dataset.map(lambda ex: {k: tf.identity(v) for k, v in ex.items()})


class Problem:
    """Base class: a named source of (inputs, targets) id sequences.

    Subclasses set `name` and implement `vocab_size`, `generate` and `id_to_token`.
    `dataset` and `decode` have generic implementations built on those.
    """

    name = "problem"
    token_separator = " "  # Joins decoded tokens in `decode`.
    reports_bleu = False  # evaluations decode the dev set and report BLEU

    @property
    def vocab_size(self):
        """Number of ids, reserved ones included: every id is < vocab_size."""
        raise NotImplementedError(f"{type(self).__name__} must define vocab_size.")

    def load(self, data_dir):
        """Reads what the problem keeps in `data_dir` (e.g. its vocabulary).

        Called once by the trainer before `vocab_size` is used. In-process problems
        keep nothing on disk; file-backed problems override this and raise a
        one-line t2t_lite.errors.UserError for missing or bad files.
        """
        del data_dir

    def vocab_fingerprint(self):
        """A string that changes whenever the id ↔ token mapping changes.

        Stored next to a run's checkpoints so a restart with another vocabulary is
        refused instead of silently training on scrambled ids.
        """
        return f"{self.name}:{self.vocab_size}"

    def generate(self, split):
        """Returns a list of (inputs, targets) int lists, each ending with EOS."""
        raise NotImplementedError(f"{type(self).__name__} must define generate().")

    def id_to_token(self, token_id):
        """Returns the printable form of one non-reserved id."""
        raise NotImplementedError(f"{type(self).__name__} must define id_to_token().")

    def dataset(self, split, data_dir=None):
        """Unbatched tf.data.Dataset of {"inputs": int32 [None], "targets": int32 [None]}.

        The generic version goes through `generate`; subclasses with a cheaper source
        (e.g. flat numpy arrays) override it. `data_dir` is for file-backed problems.
        """
        del data_dir  # Unused by in-process problems.
        pairs = self.generate(check_split(split))
        parts = []
        for column in (0, 1):
            seqs = [pair[column] for pair in pairs]
            lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
            flat = np.fromiter(
                (t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum())
            )
            parts.append((flat, lengths))
        return _ragged_dataset(*parts)

    def replica_dataset(self, split, data_dir, replica, num_replicas):
        """Shard `replica` of `num_replicas` of `dataset(split)`, for data-parallel
        training: every example goes to exactly one replica. This generic version
        shards by example; problems stored in several files shard by file."""
        dataset = self.dataset(split, data_dir)
        return dataset.shard(num_replicas, replica) if num_replicas > 1 else dataset

    def encode_inputs(self, text):
        """Text as `decode` writes it → input ids ending with EOS (for t2t-decoder).

        Raises ValueError naming the first token that is not in the vocabulary.
        """
        if not hasattr(self, "_token_ids"):
            self._token_ids = {
                self.id_to_token(i): i for i in range(NUM_RESERVED_IDS, self.vocab_size)
            }
        tokens = text.split(self.token_separator) if self.token_separator else text
        ids = []
        for token in tokens:
            if token.strip() == "":
                continue
            if token.strip() not in self._token_ids:
                raise ValueError(
                    f"token {token.strip()!r} is not in {self.name}'s vocabulary"
                )
            ids.append(self._token_ids[token.strip()])
        return ids + [EOS_ID]

    def has_split(self, split):
        """Whether this problem's data has `split` ("test" only where datagen wrote
        one; in-process problems generate train and dev, as T2T's did)."""
        return split in SPLITS

    def require_split(self, split):
        """Raises a one-line UserError unless the problem's data has `split`."""
        if not self.has_split(split):
            raise UserError(
                f"problem {self.name} has no {split} split (it generates "
                f"{' and '.join(SPLITS)} only); evaluate on dev instead."
            )

    def dev_text(self):
        """(sources, references): dev sentences as text, for BLEU while training."""
        return self.split_text("dev")

    def split_text(self, split):
        """(sources, references) of `split` ("dev" or "test") as text, for BLEU.

        In-process problems write their ids as text; file-backed problems return the
        raw text t2t-datagen kept (references must not be re-tokenized).
        """
        pairs = self.generate(split)
        return (
            [self.decode(inputs) for inputs, _ in pairs],
            [self.decode(targets) for _, targets in pairs],
        )

    def decode(self, ids):
        """Turns ids into a readable string for logs: stops at EOS, skips padding.

        Accepts a list, a numpy array or an eager tensor. Ids outside the vocabulary
        (possible from an untrained model) print as <id> rather than failing a log line.
        """
        tokens = []
        for token_id in np.asarray(ids).reshape(-1).tolist():
            if token_id == EOS_ID:
                break
            if token_id == PAD_ID:
                continue
            if NUM_RESERVED_IDS <= token_id < self.vocab_size:
                tokens.append(self.id_to_token(token_id))
            else:
                tokens.append(f"<{token_id}>")
        return self.token_separator.join(tokens)


class AlgorithmicProblem(Problem):
    """Shared machinery of the seeded algorithmic problems.

    Subclasses implement `_generate_arrays(rng, size)` returning flat (concatenated)
    inputs and targets without EOS, plus their per-example lengths. Data is generated
    once per split and cached as flat arrays; `generate` and `dataset` both read them.
    """

    def __init__(self, train_size, dev_size, seed):
        self.train_size = _check_int("train_size", train_size, 0)
        self.dev_size = _check_int("dev_size", dev_size, 0)
        self.seed = _check_int("seed", seed, 0)
        self._cache = {}

    def _generate_arrays(self, rng, size):
        raise NotImplementedError(
            f"{type(self).__name__} must define _generate_arrays()."
        )

    def _split_arrays(self, split):
        """Returns ((inputs_flat, inputs_lengths), (targets_flat, targets_lengths))."""
        check_split(split)
        if split not in self._cache:
            # A fixed per-split seed: deterministic, and dev is held out from train's
            # random stream (short sequences can still coincide by chance).
            rng = np.random.default_rng([self.seed, _SPLIT_INDEX[split]])
            size = self.train_size if split == "train" else self.dev_size
            in_flat, in_len, tgt_flat, tgt_len = self._generate_arrays(rng, size)
            self._cache[split] = (
                append_eos(in_flat, in_len),
                append_eos(tgt_flat, tgt_len),
            )
        return self._cache[split]

    def generate(self, split):
        """Returns a fresh list of (inputs, targets) int lists, each ending with EOS."""
        inputs, targets = self._split_arrays(split)
        return list(zip(_to_lists(*inputs), _to_lists(*targets)))

    def dataset(self, split, data_dir=None):
        """Unbatched dataset straight from the cached flat arrays (no list round trip)."""
        del data_dir  # Generated in-process; nothing is read from disk.
        return _ragged_dataset(*self._split_arrays(split))


class _SymbolSequenceProblem(AlgorithmicProblem):
    """Random sequences over `num_symbols` symbols; subclasses map inputs to targets."""

    def __init__(
        self,
        num_symbols=10,
        min_length=1,
        max_length=12,
        train_size=50000,
        dev_size=1000,
        seed=1,
    ):
        super().__init__(train_size, dev_size, seed)
        self.num_symbols = _check_int("num_symbols", num_symbols, 1)
        self.min_length = _check_int("min_length", min_length, 1)
        self.max_length = _check_int("max_length", max_length, 1)
        if self.max_length < self.min_length:
            raise ValueError(
                f"max_length ({max_length}) must be >= min_length ({min_length})."
            )

    @property
    def vocab_size(self):
        return NUM_RESERVED_IDS + self.num_symbols

    def id_to_token(self, token_id):
        return str(token_id - NUM_RESERVED_IDS)  # Symbol k prints as "k".

    def _random_sequences(self, rng, size):
        """Flat random symbols and lengths in [min_length, max_length] (EOS excluded)."""
        lengths = rng.integers(self.min_length, self.max_length + 1, size=size)
        flat = rng.integers(
            NUM_RESERVED_IDS,
            NUM_RESERVED_IDS + self.num_symbols,
            size=int(lengths.sum()),
            dtype=np.int32,
        )
        return flat, lengths.astype(np.int64)


class AlgorithmicIdentity(_SymbolSequenceProblem):
    """Copy the input: the simplest sanity check that a model can learn at all."""

    name = "algorithmic_identity"

    def _generate_arrays(self, rng, size):
        flat, lengths = self._random_sequences(rng, size)
        return flat, lengths, flat.copy(), lengths.copy()


class AlgorithmicReverse(_SymbolSequenceProblem):
    """Reverse the input: needs attention over the whole source, not just position i."""

    name = "algorithmic_reverse"

    def _generate_arrays(self, rng, size):
        flat, lengths = self._random_sequences(rng, size)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        segment = np.repeat(np.arange(size), lengths)
        position = np.arange(flat.size)
        # Position p in segment [s, e) takes its value from s + (e - 1 - p).
        reversed_flat = flat[starts[segment] + ends[segment] - 1 - position]
        return flat, lengths, reversed_flat, lengths.copy()


class AlgorithmicAdditionDecimal(AlgorithmicProblem):
    """Add two decimal numbers: input "a + b" as digits, target the digits of a+b.

    Most significant digit first. Each operand has 1..max_digits digits (no leading
    zeros; the 1-digit case includes 0). Digits 0-9 are ids 2..11, '+' is id 12.
    """

    name = "algorithmic_addition_decimal"
    token_separator = ""
    PLUS_ID = NUM_RESERVED_IDS + 10
    _MAX_DIGITS_LIMIT = 18  # a + b must fit in int64.

    def __init__(self, max_digits=5, train_size=50000, dev_size=1000, seed=1):
        super().__init__(train_size, dev_size, seed)
        self.max_digits = _check_int(
            "max_digits", max_digits, 1, self._MAX_DIGITS_LIMIT
        )

    @property
    def vocab_size(self):
        return self.PLUS_ID + 1

    def id_to_token(self, token_id):
        return "+" if token_id == self.PLUS_ID else str(token_id - NUM_RESERVED_IDS)

    def _random_numbers(self, rng, size):
        """Numbers whose digit count is uniform in 1..max_digits."""
        digits = rng.integers(1, self.max_digits + 1, size=size)
        low = np.where(digits == 1, 0, np.power(10, digits - 1))
        return rng.integers(low, np.power(10, digits), dtype=np.int64)

    def _strings_to_ids(self, strings):
        """Maps strings over '0'-'9' and '+' to flat ids and per-string lengths."""
        codes = np.frombuffer("".join(strings).encode("ascii"), dtype=np.uint8)
        flat = codes.astype(np.int32) - ord("0") + NUM_RESERVED_IDS
        flat[codes == ord("+")] = self.PLUS_ID
        lengths = np.fromiter(map(len, strings), dtype=np.int64, count=len(strings))
        return flat, lengths

    def _generate_arrays(self, rng, size):
        a = self._random_numbers(rng, size).tolist()
        b = self._random_numbers(rng, size).tolist()
        # One cheap f-string per example; the digit mapping itself is vectorized.
        in_flat, in_len = self._strings_to_ids([f"{x}+{y}" for x, y in zip(a, b)])
        tgt_flat, tgt_len = self._strings_to_ids([str(x + y) for x, y in zip(a, b)])
        return in_flat, in_len, tgt_flat, tgt_len
