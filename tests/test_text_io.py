"""Parallel text files: plain and .gz; bad inputs give one-line errors naming file and
line (in-process, and once through the t2t-datagen CLI)."""

import gzip

import pytest
from support.cli_helpers import assert_user_error, run_cli

from t2t_lite.data import datagen, text_io
from t2t_lite.data.text_problems import TranslateParallelText
from t2t_lite.errors import UserError


def write(path, data, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(path)


def pairs(src, tgt):
    return list(text_io.read_parallel(src, tgt))


def test_plain_gz_crlf_bom_and_blank_lines(tmp_path):
    src = write(tmp_path / "a.de.gz", "\ufeffeins\r\nzwei \n\ndrei\n", gz=True)
    tgt = write(tmp_path / "a.en", "one\ntwo\nnothing\nthree")  # no final newline
    assert pairs(src, tgt) == [
        (1, "eins", "one"),
        (2, "zwei", "two"),
        (3, "", "nothing"),
        (4, "drei", "three"),
    ]


@pytest.mark.parametrize(
    "source, target, message",
    [
        ("a\nb\nc\n", "x\ny\n", r"t\.txt has 2 lines but .*s\.txt has 3"),
        ("a\n", "x\ny\nz\n", r"s\.txt has 1 lines but .*t\.txt has 3"),
        ("", "x\n", r"s\.txt is empty \(but .*t\.txt is not\)"),
        ("", "", r"s\.txt is empty \(and so is .*t\.txt\)"),
        (
            "ok\nbad \xff byte\n".encode("latin-1"),
            "x\ny\n",
            r"s\.txt:2: not valid UTF-8",
        ),
        ("a\nb\n", b"x\n\xc3\n", r"t\.txt:2: not valid UTF-8"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, source, target, message):
    src = write(tmp_path / "s.txt", source)
    tgt = write(tmp_path / "t.txt", target)
    with pytest.raises(UserError, match=message) as info:
        pairs(src, tgt)
    assert "\n" not in str(info.value)


def test_missing_directory_and_broken_gzip(tmp_path):
    ok = write(tmp_path / "ok.txt", "a\n")
    with pytest.raises(UserError, match=r"nope\.txt: no such file"):
        pairs(str(tmp_path / "nope.txt"), ok)
    with pytest.raises(UserError, match="is a directory"):
        pairs(str(tmp_path), ok)
    lines = "".join(f"line {i * 7919 % 10007}\n" for i in range(1000)).encode()
    broken = tmp_path / "broken.txt.gz"
    broken.write_bytes(gzip.compress(lines)[:1000])  # cut in the middle
    many = write(tmp_path / "many.txt", lines)
    with pytest.raises(UserError, match=r"broken\.txt\.gz: cannot be read after line"):
        pairs(str(broken), many)


def _generate(tmp_path, **files):
    config = datagen.DatagenConfig(vocab_size=20, num_shards=1, **files)
    data_dir = str(tmp_path / "data")
    datagen.generate(TranslateParallelText(), data_dir, config=config, log=lambda _: 0)
    return data_dir


def test_datagen_checks_inputs_before_writing_anything(tmp_path):
    good = write(tmp_path / "good.txt", "a b\n" * 50)
    bad = write(tmp_path / "bad.txt", "a b\n" * 49)
    with pytest.raises(UserError, match=r"bad\.txt has 49 lines"):
        _generate(
            tmp_path,
            train_source=(good,),
            train_target=(good,),
            dev_source=(good,),
            dev_target=(bad,),
        )
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "files, message",
    [
        ({}, "needs train_source and train_target"),
        ({"train_source": ("a",), "train_target": ()}, "needs train_source"),
        (
            {"train_source": ("a", "b"), "train_target": ("c",)},
            "train_source lists 2 file",
        ),
        (
            {"train_source": ("a",), "train_target": ("b",), "tfds_data_dir": "x"},
            "tfds_data_dir is not used by problem translate_parallel_text",
        ),
    ],
)
def test_datagen_flag_mistakes(tmp_path, files, message):
    with pytest.raises(UserError, match=message):
        _generate(tmp_path, **files)


def test_cli_prints_one_line_error_and_exits_2(tmp_path):
    src = write(tmp_path / "train.de", "a\nb\n")
    tgt = write(tmp_path / "train.en", "x\n")
    result = run_cli(
        "datagen",
        "--problem=translate_parallel_text",
        f"--data_dir={tmp_path / 'data'}",
        f"--train_source={src}",
        f"--train_target={tgt}",
    )
    assert_user_error(
        result, "t2t-datagen", "train.en has 1 lines but", "train.de has 2"
    )
