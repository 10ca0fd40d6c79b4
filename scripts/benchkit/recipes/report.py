"""The report of scripts/bench_recipes.py: from the runs' results (recipes/runs.py's run) to
the summary, the Markdown tables and the figure. Plain Python and matplotlib, no
TensorFlow, so that it can be tested on made-up results.

Definitions:
- A recipe's value at a mark is the mean over its runs (seeds) at that mark; runs of
  one recipe have the same marks.
- At equal tokens: the levels are 1/4, 1/2 and all of the fewest tokens any recipe
  trained on by its last mark; each run's dev loss and BLEU there are interpolated
  linearly between its two marks around the level (no value below a run's first mark).
- Time to the target (the reference recipe's final dev loss, mean over its runs): the
  first crossing of each run's dev-loss curve, linear between the two marks around it;
  a run already below the target at its first mark gets that mark's time, flagged as
  an upper bound ("≤"). The recipe's time is the median over the runs that got there,
  its ratio that time over the reference recipe's own time, measured the same way.
- Filler runs (an extra seed of the reference recipe that keeps a core busy when the
  runs do not fill the last group) enter only the noise table.
"""

import itertools
import statistics

from benchkit import harness

KEYS = ("train_seconds", "tokens_seen", "dev_loss", "bleu")
END_KEYS = (
    "train_seconds",
    "micro_steps",
    "updates",
    "tokens_seen",
    "tokens_per_update",
    "dev_loss",
    "bleu",
    "bleu_final_decode",
)


def interpolate(xs, ys, x):
    """y at x on the polyline through (xs, ys) (xs ascending); None outside it."""
    points = [(a, b) for a, b in zip(xs, ys) if b is not None]
    if not points or x < points[0][0] or x > points[-1][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[0][1]


def first_crossing(xs, losses, target):
    """(x, bound): where the loss first reaches `target`, linear between marks;
    bound True when it was already there at the first mark. (None, False) if never."""
    for i, loss in enumerate(losses):
        if loss is None or loss > target:
            continue
        if i == 0:
            return xs[0], True
        x0, x1, y0, y1 = xs[i - 1], xs[i], losses[i - 1], loss
        return x0 + (x1 - x0) * (y0 - target) / (y0 - y1), False
    return None, False


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _series(run, key):
    return [mark.get(key) for mark in run["marks"]]


def _to_target(runs, target):
    """Median seconds and tokens to the target over the runs that reached it."""
    seconds, tokens, bound = [], [], False
    for run in runs:
        losses = _series(run, "dev_loss")
        x, first = first_crossing(_series(run, "train_seconds"), losses, target)
        if x is None:
            continue
        seconds.append(x)
        tokens.append(first_crossing(_series(run, "tokens_seen"), losses, target)[0])
        bound = bound or first
    return {
        "seconds": statistics.median(seconds) if seconds else None,
        "tokens": statistics.median(tokens) if tokens else None,
        "reached": len(seconds),
        "runs": len(runs),
        "upper_bound": bound,
    }


def core_share(run):
    """CPU seconds over wall seconds between the run's first and last mark (from
    the loop's start if it has one mark): about 1 when the core was its own."""
    first, last = run["marks"][0], run["marks"][-1]
    if len(run["marks"]) == 1:
        return last["cpu_seconds"] / max(last["wall_seconds"], 1e-9)
    wall = last["wall_seconds"] - first["wall_seconds"]
    return (last["cpu_seconds"] - first["cpu_seconds"]) / max(wall, 1e-9)


def _recipe_summary(name, hparams, runs, token_levels):
    regular = [r for r in runs if r["status"] == "ok" and not r["filler"]]
    errors = sorted({r["error"] for r in runs if r["status"] != "ok"})
    summary = {"hparams": hparams, "runs": runs}
    if not regular:
        return {**summary, "status": "error", "error": "; ".join(errors)}
    marks = len(regular[0]["marks"])
    at_marks = [
        {k: _mean([r["marks"][i].get(k) for r in regular]) for k in KEYS}
        for i in range(marks)
    ]
    end = {k: _mean([r["marks"][-1].get(k) for r in regular]) for k in END_KEYS}
    end["core_share"] = _mean([core_share(r) for r in regular])
    at_tokens = []
    for level in token_levels:
        point = {"tokens": level}
        for key in ("dev_loss", "bleu"):
            point[key] = _mean(
                [
                    interpolate(_series(r, "tokens_seen"), _series(r, key), level)
                    for r in regular
                ]
            )
        at_tokens.append(point)
    summary.update(status="ok", at_marks=at_marks, end=end, at_tokens=at_tokens)
    if errors:
        summary["error"] = "; ".join(errors)  # some seeds failed
    return summary


def summarize(results, recipes, reference, mark_seconds, clock="wall"):
    """The benchmark's summary: per recipe (in `recipes` order, {name: hparams})
    its runs, means at each mark and at the end, values at equal tokens, time to
    the reference's final dev loss; plus that target and the token levels. `clock`
    names what the runs' training seconds count (wall or cpu time)."""
    ok = [r for r in results if r["status"] == "ok" and not r["filler"]]
    fewest = min((r["marks"][-1]["tokens_seen"] for r in ok), default=0)
    token_levels = [round(fewest * q) for q in (0.25, 0.5, 1.0)] if fewest else []
    by_name = {
        name: _recipe_summary(
            name, hparams, [r for r in results if r["recipe"] == name], token_levels
        )
        for name, hparams in recipes.items()
    }
    summary = {
        "reference": reference,
        "clock": clock,
        "mark_seconds": mark_seconds,
        "token_levels": token_levels,
        "target_loss": None,
        "recipes": by_name,
    }
    ref = by_name.get(reference, {})
    if ref.get("status") != "ok":
        return summary
    target = ref["end"]["dev_loss"]
    summary["target_loss"] = target
    reference_runs = [r for r in ref["runs"] if r["status"] == "ok" and not r["filler"]]
    ref_time = _to_target(reference_runs, target)
    for recipe in by_name.values():
        if recipe["status"] != "ok":
            continue
        regular = [r for r in recipe["runs"] if r["status"] == "ok" and not r["filler"]]
        reach = _to_target(regular, target)
        for key in ("seconds", "tokens"):
            both = reach[key] is not None and ref_time[key]
            reach[f"{key}_ratio"] = reach[key] / ref_time[key] if both else None
        recipe["to_target"] = reach
    return summary


# --- Markdown ----------------------------------------------------------------------


def _fmt(value, digits=4):
    if value is None:
        return "—"
    if isinstance(value, float) and digits == 0:
        return f"{value:.0f}"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _bleu(value):
    return "—" if value is None else f"{value:.2f}"


def _tokens(value):
    if value is None:
        return "—"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}k"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _runs_label(recipe):
    regular = [r for r in recipe["runs"] if r["status"] == "ok" and not r["filler"]]
    return f" (mean of {len(regular)})" if len(regular) > 1 else ""


def end_table(summary):
    header = [
        "recipe",
        f"train s ({summary['clock']})",
        "micro-steps",
        "updates",
        "tokens",
        "tokens/update (end)",
        "core share",
        "dev loss",
        "BLEU greedy",
        "BLEU final decode",
        "time to target",
        "× reference",
        "tokens to target",
    ]
    rows = []
    for name, recipe in summary["recipes"].items():
        if recipe["status"] != "ok":
            rows.append([name, f"**failed**: {recipe['error']}"] + [""] * 11)
            continue
        end, reach = recipe["end"], recipe.get("to_target", {})
        time_text = _fmt(reach.get("seconds"), 0)
        if reach and reach["reached"] < reach["runs"]:
            time_text += f" ({reach['reached']}/{reach['runs']} runs)"
        if reach.get("upper_bound"):
            time_text = "≤ " + time_text
        ratio = reach.get("seconds_ratio")
        rows.append(
            [
                name + _runs_label(recipe),
                _fmt(end["train_seconds"], 0),
                _fmt(end["micro_steps"], 0),
                _fmt(end["updates"], 0),
                _tokens(end["tokens_seen"]),
                _fmt(end["tokens_per_update"], 0),
                f"{end['core_share']:.2f}",
                _fmt(end["dev_loss"]),
                _bleu(end["bleu"]),
                _bleu(end["bleu_final_decode"]),
                time_text,
                f"{ratio:.2f}×" if ratio is not None else "—",
                _tokens(reach.get("tokens")),
            ]
        )
    return _table(header, rows)


def marks_table(summary, key):
    header = ["recipe"] + [f"{s / 60:.3g} min" for s in summary["mark_seconds"]]
    rows = []
    for name, recipe in summary["recipes"].items():
        if recipe["status"] == "ok":
            show = _fmt if key == "dev_loss" else _bleu
            rows.append([name] + [show(m[key]) for m in recipe["at_marks"]])
    return _table(header, rows)


def tokens_table(summary):
    header = ["recipe"]
    for level in summary["token_levels"]:
        header += [f"dev loss @ {_tokens(level)}", f"BLEU @ {_tokens(level)}"]
    rows = []
    for name, recipe in summary["recipes"].items():
        if recipe["status"] == "ok":
            row = [name]
            for point in recipe["at_tokens"]:
                row += [_fmt(point["dev_loss"]), _bleu(point["bleu"])]
            rows.append(row)
    return _table(header, rows)


def noise_table(summary):
    """One row per recipe with two or more successful runs (filler runs included):
    the final dev loss and BLEU of each seed and their spread."""
    rows = []
    for name, recipe in summary["recipes"].items():
        runs = [r for r in recipe["runs"] if r["status"] == "ok"]
        if len(runs) < 2:
            continue
        losses = [r["marks"][-1]["dev_loss"] for r in runs]
        bleus = [r["marks"][-1].get("bleu") for r in runs]
        seeds = [f"{r['seed']}{'*' if r['filler'] else ''}" for r in runs]
        rows.append(
            [
                name,
                ", ".join(seeds),
                ", ".join(_fmt(v) for v in losses),
                harness.percent(harness.spread(losses)),
                ", ".join(_bleu(v) for v in bleus),
            ]
        )
    if not rows:
        return ""
    header = ["recipe", "seeds (* filler)", "final dev loss", "spread", "final BLEU"]
    return _table(header, rows)


def shared_cores_warning(summary, below=0.9):
    """A line when some run got less than `below` of its core, or ""."""
    shares = [
        core_share(run)
        for recipe in summary["recipes"].values()
        for run in recipe["runs"]
        if run["status"] == "ok"
    ]
    if not shares or min(shares) >= below:
        return ""
    advice = (
        " --clock=cpu counts the CPU time each run got instead."
        if summary["clock"] == "wall"
        else ""
    )
    return (
        f"Other processes shared the cores: the runs got {min(shares):.2f} to "
        f"{max(shares):.2f} of theirs (core share), so equal wall time was not equal "
        f"work, unevenly so between groups run at different times.{advice}"
    )


def markdown(summary):
    """The report's tables, with a heading line before each."""
    target, clock = summary["target_loss"], summary["clock"]
    time_kind = "wall time" if clock == "wall" else "CPU time"
    parts = [
        "At the end of training (means over seeds); target = the reference "
        f"{summary['reference']}'s final dev loss "
        + (f"{target:.4g}" if target is not None else "(no reference run)"),
        end_table(summary),
        f"Dev loss at equal {time_kind} (each mark)",
        marks_table(summary, "dev_loss"),
        f"BLEU (greedy) at equal {time_kind} (each mark)",
        marks_table(summary, "bleu"),
        "At equal tokens trained on (interpolated between marks)",
        tokens_table(summary),
    ]
    noise = noise_table(summary)
    parts += ["Run-to-run noise (final values per seed)", noise] if noise else []
    warning = shared_cores_warning(summary)
    return "\n\n".join(parts + ([warning] if warning else []))


# --- the figure --------------------------------------------------------------------


def plot(summary, path, title):
    """Dev loss and BLEU against training minutes and tokens, one colour per
    recipe (its mean core share in the legend), one line per run (filler runs
    dashed); the target as a grey line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5), sharex="col")
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ok = [n for n, r in summary["recipes"].items() if r["status"] == "ok"]
    for index, name in enumerate(ok):
        color = cycle[index % len(cycle)]
        share = summary["recipes"][name]["end"]["core_share"]
        for number, run in enumerate(summary["recipes"][name]["runs"]):
            if run["status"] != "ok":
                continue
            style = {
                "color": color,
                "marker": "o",
                "markersize": 3,
                "linestyle": "--" if run["filler"] else "-",
                "label": f"{name} (core share {share:.2f})" if number == 0 else None,
            }
            minutes = [s / 60 for s in _series(run, "train_seconds")]
            tokens = [t / 1e6 for t in _series(run, "tokens_seen")]
            for row, key in enumerate(("dev_loss", "bleu")):
                values = _series(run, key)
                axes[row][0].plot(minutes, values, **style)
                axes[row][1].plot(tokens, values, **style)
    for column in (0, 1):
        if summary["target_loss"] is not None:
            axes[0][column].axhline(summary["target_loss"], color="grey", lw=0.8)
        axes[0][column].set_ylabel("dev loss")
        axes[1][column].set_ylabel("dev BLEU (greedy)")
        for row in (0, 1):
            axes[row][column].grid(alpha=0.3)
    what = "wall time" if summary["clock"] == "wall" else "CPU time"
    axes[1][0].set_xlabel(f"training {what} (minutes)")
    axes[1][1].set_xlabel("target tokens trained on (millions)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
