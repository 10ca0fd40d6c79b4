"""translate_numbers_en_fr: numbers written in English words → in French words.

A small, real text-to-text problem generated in-process from a seed, so the quick
start and the tests run the full text path (datagen, SentencePiece, TFRecords,
training) without downloads:

    "three hundred forty-two thousand seventy-one"
        → "trois cent quarante-deux mille soixante et onze"

French is not a word-by-word copy: 70-99 are built on 60 and 80 ("soixante-dix-sept"
is 60+17, "quatre-vingt-onze" 4×20+11), "et" appears only in 21-71 ending in one,
"cent" and "quatre-vingt" take an "s" only when nothing follows and not before "mille",
"mille" never does. Numbers are drawn with a digit count uniform in 1..max_digits, so
small ones are common; dev numbers are never training numbers, and test numbers
(a third split, as large as dev by default) are neither.
"""

import numpy as np

from t2t_lite.data.text_problems import FILE_OPTIONS, TextProblem, reject_options

_EN_SMALL = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_EN_TENS = [
    "_",
    "_",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "seventy",
    "eighty",
    "ninety",
]
_FR_SMALL = [
    "zéro",
    "un",
    "deux",
    "trois",
    "quatre",
    "cinq",
    "six",
    "sept",
    "huit",
    "neuf",
    "dix",
    "onze",
    "douze",
    "treize",
    "quatorze",
    "quinze",
    "seize",
    "dix-sept",
    "dix-huit",
    "dix-neuf",
]
_FR_TENS = [
    "_",
    "_",
    "vingt",
    "trente",
    "quarante",
    "cinquante",
    "soixante",
    "_",
    "quatre-vingt",
    "_",
]
MAX_DIGITS = 9  # up to 999 999 999


def _english_below_1000(n):
    hundreds, rest = divmod(n, 100)
    words = [f"{_EN_SMALL[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, units = divmod(rest, 10)
        words.append(_EN_TENS[tens] + (f"-{_EN_SMALL[units]}" if units else ""))
    elif rest:
        words.append(_EN_SMALL[rest])
    return " ".join(words)


def english_words(n):
    """0 ≤ n < 10**9 in US English words: "one million two hundred thousand five"."""
    if not 0 <= n < 10**MAX_DIGITS:
        raise ValueError(f"english_words: {n} is outside [0, {10**MAX_DIGITS}).")
    if n == 0:
        return _EN_SMALL[0]
    millions, rest = divmod(n, 10**6)
    thousands, units = divmod(rest, 1000)
    words = []
    for value, scale in ((millions, " million"), (thousands, " thousand"), (units, "")):
        if value:
            words.append(_english_below_1000(value) + scale)
    return " ".join(words)


def _french_below_100(n, final):
    """1 ≤ n < 100; `final`: nothing follows (quatre-vingts takes its s)."""
    if n < 20:
        return _FR_SMALL[n]
    tens, units = divmod(n, 10)
    if tens in (7, 9):  # soixante-dix..., quatre-vingt-dix...: 60 or 80 + 10..19
        base, rest = _FR_TENS[tens - 1], n - (tens - 1) * 10
        joiner = " et " if rest == 11 and tens == 7 else "-"
        return f"{base}{joiner}{_FR_SMALL[rest]}"
    base = _FR_TENS[tens]
    if units == 0:
        return base + ("s" if tens == 8 and final else "")
    if units == 1 and tens != 8:
        return f"{base} et un"
    return f"{base}-{_FR_SMALL[units]}"


def _french_below_1000(n, final):
    """1 ≤ n < 1000; `final`: the group ends the number or precedes "million(s)"."""
    hundreds, rest = divmod(n, 100)
    words = []
    if hundreds:
        cent = "cent" if hundreds == 1 else f"{_FR_SMALL[hundreds]} cent"
        words.append(cent + ("s" if hundreds > 1 and rest == 0 and final else ""))
    if rest:
        words.append(_french_below_100(rest, final))
    return " ".join(words)


def french_words(n):
    """0 ≤ n < 10**9 in French words (traditional spelling, hyphens below 100)."""
    if not 0 <= n < 10**MAX_DIGITS:
        raise ValueError(f"french_words: {n} is outside [0, {10**MAX_DIGITS}).")
    if n == 0:
        return _FR_SMALL[0]
    millions, rest = divmod(n, 10**6)
    thousands, units = divmod(rest, 1000)
    words = []
    if millions:  # "million" is a noun: "deux millions", "quatre-vingts millions"
        plural = "s" if millions > 1 else ""
        words.append(f"{_french_below_1000(millions, True)} million{plural}")
    if thousands:  # "mille" is invariable and "un mille" is just "mille"
        words.append(
            "mille"
            if thousands == 1
            else f"{_french_below_1000(thousands, False)} mille"
        )
    if units:
        words.append(_french_below_1000(units, True))
    return " ".join(words)


def random_numbers(rng, size, max_digits):
    """`size` integers whose digit count is uniform in 1..max_digits."""
    digits = rng.integers(1, max_digits + 1, size=size)
    low = np.where(digits == 1, 0, np.power(10, digits - 1))
    return rng.integers(low, np.power(10, digits), dtype=np.int64)


class NumbersCorpus:
    """Seeded (english, french) pairs: train draws, then dev draws not in train, then
    test draws in neither (drawn after dev, so dev is what it was without test)."""

    def __init__(self, train_size, dev_size, max_digits, seed, test_size=0):
        self.sizes = {"train": train_size, "dev": dev_size}
        if test_size:
            self.sizes["test"] = test_size
        self.max_digits = max_digits
        self.seed = seed
        self._numbers = None

    def describe(self):
        return {
            "generator": "numbers_en_fr/1",
            "sizes": self.sizes,
            "max_digits": self.max_digits,
            "seed": self.seed,
        }

    def check(self, log):
        del log  # Nothing to check: the data is generated.

    def size(self, split):
        return self.sizes[split]

    def has_test_split(self):
        return "test" in self.sizes

    def _unseen(self, rng, seen, split):
        """`sizes[split]` new numbers not in `seen` (which they join)."""
        size, drawn = self.sizes[split], []
        for _ in range(100):
            if len(drawn) == size:
                break
            for n in random_numbers(rng, 4 * size, self.max_digits):
                if int(n) not in seen and len(drawn) < size:
                    seen.add(int(n))
                    drawn.append(int(n))
        if len(drawn) < size:
            raise ValueError(
                f"only {len(drawn)} numbers of at most {self.max_digits} digits are "
                f"not in earlier splits; lower {split}_size or raise max_digits."
            )
        return drawn

    def numbers(self, split):
        if self._numbers is None:
            rng = np.random.default_rng([self.seed, 0])
            train = random_numbers(rng, self.sizes["train"], self.max_digits)
            seen = set(train.tolist())
            self._numbers = {"train": train.tolist()}
            for name in ("dev", "test"):
                if name in self.sizes:
                    self._numbers[name] = self._unseen(rng, seen, name)
        return self._numbers[split]

    def pairs(self, split):
        for n in self.numbers(split):
            yield english_words(n), french_words(n)


class TranslateNumbersEnFr(TextProblem):
    """Numbers in English words → French words; 50k training pairs up to 999 999,
    1000 dev and 1000 test pairs (test_size None: as many as dev; 0: no test)."""

    name = "translate_numbers_en_fr"
    default_vocab_size = 100

    def __init__(self, train_size=50000, dev_size=1000, max_digits=6, test_size=None):
        super().__init__()
        if not 1 <= max_digits <= MAX_DIGITS:
            raise ValueError(
                f"max_digits must be in 1..{MAX_DIGITS}, got {max_digits}."
            )
        self.train_size, self.dev_size = train_size, dev_size
        self.test_size = dev_size if test_size is None else test_size
        self.max_digits = max_digits

    def corpus(self, config):
        reject_options(
            self.name,
            config,
            FILE_OPTIONS + ("tfds_data_dir", "tfds_manual_dir"),
            "it generates its own data",
        )
        return NumbersCorpus(
            self.train_size,
            self.dev_size,
            self.max_digits,
            config.seed,
            test_size=self.test_size,
        )


def write_numbers_files(source_path, target_path, size, seed=1, max_digits=6):
    """Writes `size` line-aligned (english, french) number pairs to two text files
    (gzip if a name ends with .gz): sample data for translate_parallel_text."""
    import gzip  # pylint: disable=g-import-not-at-top

    numbers = random_numbers(np.random.default_rng(seed), size, max_digits).tolist()
    for path, words in ((source_path, english_words), (target_path, french_words)):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt", encoding="utf-8") as f:
            f.writelines(f"{words(n)}\n" for n in numbers)
