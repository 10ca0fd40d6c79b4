"""bench_fit.py's report: medians over rounds of each config's step peaks, the
breakdown of live memory, the largest micro-batch found, recomputation's saving and
cost, t2t_lite's own auto-fit, and the goals."""

import os
import statistics

from benchkit import harness
from benchkit.memory import ALLOCATORS, GB, MIB, mib
from benchkit.peers import opennmt


def ok(results):
    return [r for r in results if "error" not in r]


def step_medians(results):
    """{tokens: {"live", "peak", "delta", "accumulate", "update"}} medians, bytes."""
    out = {}
    for tokens in sorted({s["tokens"] for r in ok(results) for s in r["steps"]}):
        steps = [s for r in ok(results) for s in r["steps"] if s["tokens"] == tokens]

        def med(key, steps=steps):
            return statistics.median(key(s) for s in steps)

        out[tokens] = {
            "live": med(lambda s: s["live"]),
            "peak": med(lambda s: s["peak"]),
            "delta": med(lambda s: s["peak"] - s["live"]),
            "accumulate_peak": med(lambda s: s["micro"][0]["peak"]),
            "update_peak": med(lambda s: s["micro"][1]["peak"]),
        }
    return out


def print_peaks(args, results, seen):
    print(
        f"\nPeak of one training step (accumulate + update micro-step), TF allocator "
        f"MiB, medians over {args.rounds} round(s); sentences of {args.length} "
        "tokens:\n"
    )
    print(
        "| config | micro-batch (tokens) | live before | peak | peak - live | "
        "peak of accumulate / update micro-step |"
    )
    print("|---|---|---|---|---|---|")
    table = {}
    for config, rs in results.items():
        if not ok(rs):
            print(f"| {config} | error: {rs[0]['error'][:200]} | | | | |")
            continue
        table[config] = step_medians(rs)
        for tokens, m in table[config].items():
            print(
                f"| {config} | {tokens} | {mib(m['live'])} | **{mib(m['peak'])}** | "
                f"{mib(m['delta'])} | {mib(m['accumulate_peak'])} / "
                f"{mib(m['update_peak'])} |"
            )
    if "opennmt" in args.configs:
        print(f"| opennmt | {opennmt_status(args)} | | | | |")
    names = sorted(seen["allocators"]) or ["unknown (not in the children's log)"]
    described = ", ".join(
        f"{n} ({ALLOCATORS.get(n, 'a BFC allocator')})" for n in names
    )
    onednn = {True: "on", False: "off"}.get(next(iter(seen["onednn"]), None), "?")
    print(
        f"\nallocator: {described}; oneDNN {onednn} (TF_ENABLE_ONEDNN_OPTS="
        f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')})"
    )
    return table, names, onednn


def opennmt_status(args):
    if os.path.exists(opennmt.opennmt_main(args.venv)):
        return (
            f"not measured: a venv exists at {args.venv}, but this script has no "
            "OpenNMT-tf memory driver"
        )
    return f"not available: no OpenNMT-tf venv at {args.venv}"


def print_breakdown(results, table):
    if not table:
        return {}
    print(
        "\nBreakdown, MiB (weights, slots, accumulators from the variables' shapes; "
        "other live = live before - those; activations = peak - live before):\n"
    )
    print(
        "| config | micro-batch | weights | Adam slots (m, v) | accumulators | "
        "other live | activations | peak |"
    )
    print("|---|---|---|---|---|---|---|---|")
    out = {}
    for config, rs in results.items():
        if config not in table:
            continue
        state = ok(rs)[0]["state"]
        fixed = state["weights"] + state["slots"] + state["accumulators"]
        out[config] = {"state": state, "per_tokens": {}}
        for tokens, m in table[config].items():
            other = m["live"] - fixed
            out[config]["per_tokens"][tokens] = {"other_live": other, **m}
            print(
                f"| {config} | {tokens} | {mib(state['weights'])} | "
                f"{mib(state['slots'])} | {mib(state['accumulators'])} | "
                f"{'+' if other >= 0 else ''}{mib(other)} | {mib(m['delta'])} | "
                f"{mib(m['peak'])} |"
            )
    return out


def fits_summary(args, results):
    out = {}
    for config, rs in results.items():
        fit = next((r["fit"] for r in ok(rs) if "fit" in r), None)
        if fit is None:
            continue
        at = [p for p in fit["probes"] if p["sentences"] == fit["largest_sentences"]]
        out[config] = {
            "largest_sentences": fit["largest_sentences"],
            "largest_tokens": fit["largest_tokens"],
            "peak_at_largest": at[0]["peak"] if at else None,
            "probes": len(fit["probes"]),
            "predicted": fit["predicted"],
            "probe_seconds": sum(p["seconds"] for p in fit["probes"]),
            "probe_list": [
                {**p, "fits": p["peak"] <= fit["budget_bytes"]} for p in fit["probes"]
            ],
        }
    return out


def print_fits(args, fits):
    if not fits:
        return
    print(
        f"\nLargest micro-batch whose training step peaks within --budget_gb "
        f"{args.budget_gb:g} GB ({args.budget_gb * GB / MIB:.0f} MiB), sentences of "
        f"{args.length} tokens (search in each config's last-round child):\n"
    )
    print(
        "| config | sentences | tokens | peak there (MiB) | vs keras_f32 | probes "
        "(predicted start) |"
    )
    print("|---|---|---|---|---|---|")
    keras = fits.get("keras_f32", {}).get("largest_tokens")
    for config, f in fits.items():
        ratio = f"{f['largest_tokens'] / keras:.2f}x" if keras else "-"
        peak = mib(f["peak_at_largest"]) if f["peak_at_largest"] else "-"
        print(
            f"| {config} | {f['largest_sentences']} | **{f['largest_tokens']}** | "
            f"{peak} | {ratio} | {f['probes']} ({f['predicted']}) |"
        )
    print()
    for config, f in fits.items():
        probes = ", ".join(
            f"{p['sentences']}: {mib(p['peak'])} {'fits' if p['fits'] else 'no'}"
            for p in f["probe_list"]
        )
        print(f"{config} probes (sentences: peak MiB): {probes}")


def recompute_summary(args, results, table):
    """Memory saving at every size and step time at --time_tokens."""
    if "t2t_f32" not in table or "t2t_recompute" not in table:
        return {}
    out = {"memory": {}, "time": {}}
    for tokens in table["t2t_f32"]:
        a, b = table["t2t_f32"][tokens], table["t2t_recompute"].get(tokens)
        if b:
            out["memory"][tokens] = {
                "peak_ratio": b["peak"] / a["peak"],
                "activation_ratio": b["delta"] / a["delta"],
                "saved_mib": (a["peak"] - b["peak"]) / MIB,
            }
    for key, field in (("wall", "timed"), ("cpu", "timed_cpu")):
        per_round = {
            config: [1000 * sum(r[field]) / (2 * len(r[field])) for r in ok(rs)]
            for config, rs in results.items()
        }
        ratios = [
            b / a for a, b in zip(per_round["t2t_f32"], per_round["t2t_recompute"])
        ]
        out["time"][key] = {
            "ms_per_micro_step": {
                c: statistics.median(v) for c, v in per_round.items() if v
            },
            "ms_per_micro_step_rounds": per_round,
            "recompute_ratio": statistics.median(ratios),
            "recompute_ratio_rounds": ratios,
        }
    out["time"]["tokens"] = args.time_tokens
    return out


def print_recompute(args, rec):
    if not rec:
        return
    print("\nRecomputation (t2t_recompute vs t2t_f32):\n")
    print("| micro-batch | peak ratio | activations ratio | saved MiB |")
    print("|---|---|---|---|")
    for tokens, m in rec["memory"].items():
        print(
            f"| {tokens} | {m['peak_ratio']:.3f} | {m['activation_ratio']:.3f} | "
            f"{m['saved_mib']:.0f} |"
        )
    t = rec["time"]
    for key, what in (("wall", "wall time"), ("cpu", "CPU time (process)")):
        rows = harness.summary_rows(t[key]["ms_per_micro_step_rounds"], "t2t_f32")
        print(f"\nStep time at {t['tokens']} tokens, {what}, ms per micro-step:\n")
        print(harness.markdown_table(rows, "ms", "t2t_f32"))


def print_autofit(args, found, fits):
    if not found:
        return
    print(f"\nAuto-fit, probe_batch_size under {args.budget_gb:g} GB, headroom 0.1:\n")
    print(
        "| config | batch_size | sentences | largest_sentences | search above | "
        "probes | probe_seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    for config, f in found.items():
        if "error" in f:
            print(f"| {config} | error: {f['error'][:200]} | | | | | |")
            continue
        mine = fits.get(config, {}).get("largest_sentences", "-")
        print(
            f"| {config} | {f['batch_size']} | {f['sentences']} | "
            f"{f['largest_sentences']} | {mine} | {f['probes']} | "
            f"{f['probe_seconds']:.1f} |"
        )


def goals(fits, rec):
    """The targets, each True/False (None when not measured); the step time's
    by wall clock and by CPU time."""
    keras = fits.get("keras_f32", {}).get("largest_tokens")
    f32 = fits.get("t2t_f32", {}).get("largest_tokens")
    recompute = fits.get("t2t_recompute", {}).get("largest_tokens")
    ratio = rec["time"]["wall"]["recompute_ratio"] if rec else None
    cpu_ratio = rec["time"]["cpu"]["recompute_ratio"] if rec else None
    return {
        "t2t_f32_fits_at_least_keras": None if not (keras and f32) else f32 >= keras,
        "t2t_recompute_fits_2x_keras": None
        if not (keras and recompute)
        else recompute >= 2 * keras,
        "t2t_recompute_step_time_at_most_1.35x": None
        if ratio is None
        else ratio <= 1.35,
        "t2t_recompute_cpu_time_at_most_1.35x": None
        if cpu_ratio is None
        else cpu_ratio <= 1.35,
    }
