"""scripts/benchkit/harness.py's arithmetic: the rotation of rounds, the spread, the
median of per-round ratios and the rows of the one table, on made-up numbers."""

import os
import sys

# These tests exercise the benchmark scripts themselves: scripts/ holds the benchkit
# package they are made of.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts"))
import pytest
from benchkit import harness


def test_each_round_starts_one_config_later():
    calls = []
    harness.interleave("abc", 4, lambda config, r: calls.append((r, config)))
    orders = ["".join(c for r, c in calls if r == k) for k in range(4)]
    assert orders == ["abc", "bca", "cab", "abc"]


def test_spread_is_range_over_median_in_percent():
    assert harness.spread([90.0, 100.0, 120.0]) == pytest.approx(30.0)
    assert harness.spread([5.0]) is None  # one measurement: no spread, shown as "-"
    assert harness.percent(None) == "-" and harness.percent(12.34) == "12.3%"


def test_ratio_is_the_median_of_per_round_ratios_not_a_ratio_of_medians():
    values, baseline = [2.0, 3.0, 10.0], [1.0, 3.0, 2.0]
    # Per round: 2, 1, 5 -> median 2; the ratio of medians would be 3 / 2.
    assert harness.median_ratio(values, baseline) == pytest.approx(2.0)


def test_rows_have_median_spread_and_ratio_to_the_baseline():
    rows = harness.summary_rows(
        {"base": [10.0, 20.0, 30.0], "fast": [20.0, 50.0, 60.0]},
        baseline="base",
        errors={"broken": "error: ValueError: no"},
    )
    base, fast, broken = rows
    assert base["median"] == 20.0 and base["ratio"] == pytest.approx(1.0)
    assert fast["median"] == 50.0 and fast["ratio"] == pytest.approx(2.0)
    assert fast["spread_percent"] == pytest.approx(80.0)
    assert broken == {"config": "broken", "error": "error: ValueError: no"}
    text = harness.markdown_table(rows, "tokens/s", "base", columns=("note",))
    lines = text.splitlines()
    assert lines[0] == "| config | median tokens/s | spread | × base | note |"
    assert lines[3].startswith("| fast | 50.0 | 80.0% | 2.000x |")
    assert lines[4] == "| broken | error: ValueError: no |  |  |  |"


def test_without_a_measured_baseline_there_is_no_ratio():
    (row,) = harness.summary_rows({"a": [1.0, 2.0]}, baseline="missing")
    assert row["ratio"] is None


def test_extra_columns_show_floats_as_numbers_and_none_as_a_dash():
    (row,) = harness.summary_rows({"a": [1.0]})
    row.update(ms=12.3456, share=0.123456, n=8, codes="[0, 0]", bleu=None)
    text = harness.markdown_table([row], "s", columns=("ms", "share", "n", "codes"))
    assert text.splitlines()[2] == "| a | 1.00 | - | 12.3 | 0.123 | 8 | [0, 0] |"
    assert harness.cell(None) == "-" and harness.cell(1234.5) == "1234"


def test_a_table_of_single_measurements_says_so_in_its_note(capsys, monkeypatch):
    monkeypatch.setattr(harness, "environment", lambda: "ENV")
    rows = harness.summary_rows({"float32": [2.0], "bfloat16": [2.1]}, "float32")
    harness.print_table("T", rows, "loss", "float32", note="one run each")
    out = capsys.readouterr().out
    assert "ENV\n\nT\n(one run each)\n" in out and "round(s)" not in out
    assert "| bfloat16 | 2.10 | - | 1.050x |" in out
    harness.print_table("T", rows, "loss", "float32")
    assert "(1 round(s); spread" in capsys.readouterr().out
