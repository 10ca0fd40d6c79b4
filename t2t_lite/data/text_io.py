"""Reading line-aligned parallel text: one sentence per line, UTF-8, plain or `.gz`.

Every problem with a file is a `DataFileError` (a UserError) whose one-line message
names the file and, where it applies, the line: a missing or empty file, bytes that are
not UTF-8, a broken gzip stream, a source and a target file with different numbers of
lines. Nothing here writes anything, so t2t-datagen can check all its inputs before it
touches the data directory.
"""

import gzip
import itertools
import os
import zlib

from t2t_lite.errors import UserError

_BOM = "\ufeff"


class DataFileError(UserError):
    """A data file that cannot be used; str() names the file (and line)."""


def _open_binary(path):
    if not os.path.exists(path):
        raise DataFileError(f"{path}: no such file.")
    if os.path.isdir(path):
        raise DataFileError(f"{path} is a directory; expected a text file.")
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _decode(path, number, raw, strip):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFileError(
            f"{path}:{number}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
            f"{e.start + 1}); convert the file to UTF-8, e.g. with iconv."
        ) from None
    if number == 1 and text.startswith(_BOM):
        text = text[1:]
    if strip:
        return text.strip()
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    return text


def read_lines(path, strip=True):
    """Yields (line_number, text) for every line of `path`, 1-based.

    The text is stripped of its line break and, with `strip`, of surrounding
    whitespace (`\\r\\n` files work); a UTF-8 byte-order mark at the start is dropped.
    Only `\\n` ends a line, so a stray U+2028 inside a sentence does not shift the alignment.
    """
    number = 0
    try:
        with _open_binary(path) as f:
            for number, raw in enumerate(f, 1):
                yield number, _decode(path, number, raw, strip)
    except (OSError, EOFError, zlib.error) as e:
        where = f"after line {number}" if number else "at the start"
        raise DataFileError(f"{path}: cannot be read {where} ({e}).") from None


def _count_rest(lines):
    return sum(1 for _ in lines)


def read_parallel(source_path, target_path):
    """Yields (line_number, source_text, target_text) for line-aligned files.

    Raises DataFileError when either file is empty or when their line counts differ
    (reported with both counts, after reading the longer file to its end).
    """
    source, target = read_lines(source_path), read_lines(target_path)
    count = 0
    for src, tgt in itertools.zip_longest(source, target):
        if src is None or tgt is None:
            longer, lines = (
                (target_path, target) if src is None else (source_path, source)
            )
            shorter = source_path if src is None else target_path
            if count == 0:
                raise DataFileError(f"{shorter} is empty (but {longer} is not).")
            total = count + 1 + _count_rest(lines)
            raise DataFileError(
                f"{shorter} has {count} lines but {longer} has {total}; source and "
                f"target files must have one sentence per line, line by line aligned."
            )
        count += 1
        yield src[0], src[1], tgt[1]
    if count == 0:
        raise DataFileError(f"{source_path} is empty (and so is {target_path}).")


def check_file_lists(source_paths, target_paths, what):
    """Checks that `{what}_source` and `{what}_target` list as many files."""
    if len(source_paths) != len(target_paths):
        raise UserError(
            f"{what}_source lists {len(source_paths)} file(s) but {what}_target "
            f"lists {len(target_paths)}; give one target file per source file."
        )
    for path in list(source_paths) + list(target_paths):
        if not path:
            raise UserError(f"{what}_source/{what}_target: empty file name.")
