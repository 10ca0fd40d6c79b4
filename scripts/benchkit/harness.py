"""The harness every benchmark in scripts/ runs on: the context line, interleaved
rounds, the arithmetic of side-by-side ratios, one table format and one JSON schema,
and fresh child processes.

Why side by side: the machine is shared, so an absolute number from another run means
little. Configurations take turns within a round, in an order that rotates from round
to round, so that other load on the machine hits all alike; a ratio is taken per round
(both numbers measured minutes apart) and its median over rounds is reported.

The one output format: `print_table` prints the context line (CPU cores, TF and Keras
versions, load), then a markdown table whose rows are configurations with their
median, spread and ratio to the baseline; `write_json` writes the same rows
(`summary_rows`) under one schema when a script is given --json.

This module imports no TensorFlow (environment() imports it when called), so that a
script can check its flags, or split the CPU into logical devices, first.
"""

import json
import os
import statistics
import subprocess
import sys
import time

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(SCRIPTS)

# --- context -------------------------------------------------------------------------


def load_average():
    """The 1, 5 and 15 minute load averages, e.g. "1.02 0.87 0.55"."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_start():
    """The first line of a benchmark: the load it starts under."""
    print(
        f"load average at start: {load_average()} (other processes skew the numbers)",
        flush=True,
    )


def environment():
    """CPU count, TF and Keras versions and the load: the line before a table."""
    import keras
    import tensorflow as tf

    return (
        f"{os.cpu_count()} CPU cores, TF {tf.__version__}, Keras {keras.__version__}, "
        f"load average {load_average()}"
    )


# --- rounds --------------------------------------------------------------------------


def rotation(configs, round_index):
    """The order of round `round_index`: each round starts one config later than the
    last, so that no config always follows the same one."""
    configs = list(configs)
    k = round_index % len(configs)
    return configs[k:] + configs[:k]


def interleave(configs, rounds, run_one, label=""):
    """Calls run_one(config, round) for every config, `rounds` times, in `rotation`
    order, so that other load on the machine hits all alike. Prints progress if
    `label`."""
    for round_index in range(rounds):
        for config in rotation(configs, round_index):
            run_one(config, round_index)
        if label:
            print(f"{label}: round {round_index + 1}/{rounds} done", flush=True)


# --- arithmetic ------------------------------------------------------------------------


def median_ratio(values, baseline):
    """Median over rounds of values[i] / baseline[i] (both measured in round i)."""
    return statistics.median(v / b for v, b in zip(values, baseline))


def spread(values):
    """(max - min) / median of a list of measurements, in percent; None for one
    measurement, which has no spread to show (a table prints "-", not 0.0%)."""
    if len(values) < 2:
        return None
    return 100 * (max(values) - min(values)) / statistics.median(values)


def summary_rows(measured, baseline=None, errors=None):
    """The rows of a report, one per config: {"config", "median", "spread_percent",
    "ratio" (median of per-round ratios to `baseline`, None without one), "rounds"}.

    `measured` maps a config to its value per round (round i of every config
    measured side by side); `errors` maps a config that has none to why (the text
    its row shows, e.g. "skipped: ..." or "error: ...")."""
    base = measured.get(baseline) or None
    rows = []
    for config, values in measured.items():
        if not values:
            rows.append({"config": config, "error": "error: no measurement"})
            continue
        rows.append(
            {
                "config": config,
                "median": statistics.median(values),
                "spread_percent": spread(values),
                "ratio": median_ratio(values, base) if base else None,
                "rounds": list(values),
            }
        )
    rows += [{"config": c, "error": e} for c, e in (errors or {}).items()]
    return rows


# --- the one output format -------------------------------------------------------------


def number(value, digits=None):
    """A number as a table shows it: 3 significant digits at least, no exponent."""
    if value is None:
        return "-"
    if digits is None:
        digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
        digits = 3 if abs(value) < 1 else digits
    return f"{value:.{digits}f}"


def percent(value):
    """A spread as a table shows it: one decimal and %, None as "-"."""
    return "-" if value is None else f"{value:.1f}%"


def cell(value):
    """An extra column's cell: a float as `number` shows it, None as "-", anything
    else (a string, an int) as it is."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return number(value)
    return str(value)


def markdown_table(rows, unit, baseline=None, columns=()):
    """Rows as a markdown table: config, median `unit`, spread, ratio to `baseline`,
    then `columns` (names of further keys of the rows, shown by `cell`)."""
    head = ["config", f"median {unit}", "spread"]
    head += [f"× {baseline}"] if baseline else []
    head += list(columns)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if "error" in row:
            cells = [row["config"], row["error"]]
            lines.append("| " + " | ".join(cells + [""] * (len(head) - 2)) + " |")
            continue
        cells = [row["config"], number(row["median"]), percent(row["spread_percent"])]
        if baseline:
            ratio = row["ratio"]
            cells.append("-" if ratio is None else f"{ratio:.3f}x")
        cells += [cell(row[c]) if c in row else "" for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_table(title, rows, unit, baseline=None, columns=(), note=None):
    """The context line, a title, a note on what the numbers are, and the table of
    `rows` (see markdown_table). The default note says how many rounds the medians
    are over; a table whose values are not per-round measurements (one run each, or
    repetitions that are not rounds) says so in its own `note`."""
    if note is None:
        rounds = max((len(r.get("rounds", [])) for r in rows), default=0)
        note = (
            f"{rounds} round(s); spread: (max - min) / median over rounds; "
            "ratio: median of the per-round ratios"
        )
    print(f"\n{environment()}\n\n{title}")
    print(f"({note})\n")
    print(markdown_table(rows, unit, baseline, columns), flush=True)


def write_json(path, benchmark, rows, unit, baseline=None, **extra):
    """The report's rows in the one schema (and `extra` facts) to `path`, if given."""
    if not path:
        return
    report = {
        "benchmark": benchmark,
        "environment": environment(),
        "unit": unit,
        "baseline": baseline,
        "rows": rows,
        **extra,
    }
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


def add_json_flag(parser):
    """The --json flag of a script that reports through write_json."""
    parser.add_argument("--json", default="", help="Also write the rows here (JSON).")


# --- fresh processes -------------------------------------------------------------------


def run_python(args, env=None):
    """Runs `python args...` to the end; returns (stdout, stderr). A failure raises
    with the end of the child's stderr."""
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode:
        raise RuntimeError(
            f"{' '.join(args)} exited with {result.returncode}:\n"
            + "\n".join(result.stderr.splitlines()[-20:])
        )
    return result.stdout, result.stderr


def child_rounds(script, configs, rounds, flags=(), label=""):
    """Runs `python script --config=C *flags` for every config C in a fresh
    process, `rounds` times, interleaved; returns {config: [the last JSON line each
    run printed, with "process": its whole life in seconds]}."""
    results = {config: [] for config in configs}

    def run_one(config, _):
        began = time.perf_counter()
        stdout, _ = run_python([script, f"--config={config}", *flags])
        results[config].append(
            {**last_json(stdout), "process": time.perf_counter() - began}
        )

    interleave(configs, rounds, run_one, label=label)
    return results


def last_json(stdout):
    """The last line of a child's stdout, parsed as JSON."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_t2t(program, *flags, log=None):
    """Runs `python -m t2t_lite.bin.<program> flags` from the repository root (it
    works before `pip install` has made the console scripts), its stderr kept in
    `log`. Returns its stdout; a failure raises, as in run_python, with the end of
    its stderr."""
    command = [sys.executable, "-m", f"t2t_lite.bin.{program}", *flags]
    result = subprocess.run(
        command, check=False, cwd=ROOT, capture_output=True, text=True
    )
    if log:
        with open(log, "w") as f:
            f.write(result.stderr)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited with {result.returncode}:\n"
            + result.stderr[-3000:]
        )
    return result.stdout
