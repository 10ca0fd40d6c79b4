"""bench_memory.py's item 2, what accumulation costs in memory: one model-sized
float32 copy (the accumulators), and nothing that grows per micro-step; from the
children's records of b_n8 (and b_n1, the same batches without accumulation)."""

import statistics


def micro_step_extra(results):
    """What a b_n8 micro-step allocates at its peak beyond the b_n1 step on the same
    batch (TF allocator peak above each run's own baseline, which for b_n8 already
    holds the accumulators), by kind, in MiB; the first window (tracing) skipped."""
    extra = {"accumulate": [], "update": []}
    for a, b in zip(results["b_n8"], results["b_n1"]):
        if a["baseline_tf"] is None or b["baseline_tf"] is None:
            return None
        base8, base1 = a["baseline_tf"]["current"], b["baseline_tf"]["current"]
        n = a["n"]
        for m8, m1 in list(zip(a["micro_steps"], b["micro_steps"]))[n:]:
            kind = "update" if m8["update"] else "accumulate"
            extra[kind].append((m8["tf_peak"] - base8) - (m1["tf_peak"] - base1))
    return extra


def live_above_baseline(result):
    """b_n8's TF live bytes after accumulate-only and after update micro-steps, minus
    its baseline (which holds the accumulators), from the second window on: medians."""
    base, n = result["baseline_tf"]["current"], result["n"]
    steps = result["micro_steps"][n:]
    return {
        kind: statistics.median(
            m["tf_current"] - base for m in steps if m["update"] == (kind == "update")
        )
        for kind in ("accumulate", "update")
    }


def print_accumulation_costs(args, results):
    """Item 2: one model-sized float32 copy, nothing per micro-step."""
    if "b_n8" not in results:
        return {}
    r8 = results["b_n8"][0]
    model = r8["trainable_mib"]
    out = {"trainable_mib": model, "accumulator_mib": r8["accumulator_mib"]}
    print(
        f"\naccumulators: {r8['accumulator_mib']:.2f} MiB float32; the model's "
        f"trainable variables: {model:.2f} MiB"
    )
    if "b_n1" in results and r8["baseline_tf"] is not None:
        growth = statistics.median(
            a["baseline_tf"]["current"] - b["baseline_tf"]["current"]
            for a, b in zip(results["b_n8"], results["b_n1"])
        )
        out["baseline_tf_growth_mib"] = growth
        print(f"TF live bytes at baseline, b_n8 - b_n1: {growth:.2f} MiB")
    for i, r in enumerate(results["b_n8"]):
        rss = ", ".join(f"{u['rss']:.0f}" for u in r["updates"])
        peaks = ", ".join(f"{u['rss_peak']:.0f}" for u in r["updates"])
        print(
            f"b_n8 round {i + 1}: RSS after each update {rss}; RSS peak of each {peaks}"
        )
        if r["baseline_tf"] is not None:
            live = " ".join(f"{m['tf_current']:.1f}" for m in r["micro_steps"])
            print(f"  TF live MiB after each micro-step: {live}")
    if r8["baseline_tf"] is not None and len(r8["micro_steps"]) > r8["n"]:
        live = [live_above_baseline(r) for r in results["b_n8"]]
        out["live_above_baseline_mib"] = live
        print(
            "b_n8 TF live bytes minus its baseline, from the 2nd window on: after "
            "accumulate micro-steps "
            + ", ".join(f"{x['accumulate']:+.1f}" for x in live)
            + " MiB; after updates "
            + ", ".join(f"{x['update']:+.1f}" for x in live)
            + " MiB"
        )
    out["rss_after_updates"] = [
        [u["rss"] for u in r["updates"]] for r in results["b_n8"]
    ]
    extra = micro_step_extra(results) if "b_n1" in results else None
    for kind, values in (extra or {}).items():
        if values:
            med = statistics.median(values)
            out[f"extra_{kind}_mib"] = med
            print(
                f"{kind} micro-steps of b_n8 vs the b_n1 step on the same "
                f"batch: TF peak {med:+.1f} MiB (median; {med / model:+.2f} model "
                f"copies; range {min(values):.1f}..{max(values):.1f})"
            )
    return out
