"""bench_peers.py's results: one configuration's tokens/s per round (or why there are
none), its summary, the t2t_lite/peer ratios, and the report's table."""

import statistics

from benchkit import harness

ALL_CONFIGS = (
    "t2t_f32",
    "t2t_bf16",
    "t2t_xla",
    "keras_f32",
    "keras_bf16",
    "opennmt_f32",
)
PEERS = ("keras_f32", "keras_bf16", "opennmt_f32")
DTYPES = {name: ("bfloat16" if "bf16" in name else "float32") for name in ALL_CONFIGS}
METHODS = {  # how tokens/s is measured
    "in_process": "non-pad target tokens (EOS included) / wall time of --updates "
    "updates on in-memory batches, after warmup",
    "opennmt": "target tokens/s logged by onmt-main every update, weighted by the "
    "log timestamps, after --opennmt_warmup updates",
}


class Result:
    """One configuration's outcome: per-round tokens/s, or why there are none."""

    def __init__(self, name):
        self.name, self.status, self.reason = name, "measured", ""
        self.rates, self.params, self.warmup_seconds = [], None, None
        self.update_tokens = []  # mean target tokens per update, per round
        self.method = METHODS["opennmt" if "opennmt" in name else "in_process"]

    def fail(self, reason, status="error"):
        self.status, self.reason, self.rates = status, reason, []

    def add(self, segment):
        self.rates.append(segment["tokens"] / segment["seconds"])
        self.update_tokens.append(segment["tokens"] / segment["updates"])
        if segment.get("params"):
            self.params = segment["params"]

    def summary(self, flops_per_token, peaks):
        out = {"status": self.status, "dtype": DTYPES[self.name], "method": self.method}
        if self.status != "measured":
            return {**out, "reason": self.reason}
        if not self.rates:
            return {**out, "status": "error", "reason": "no measurement"}
        median = statistics.median(self.rates)
        return {
            **out,
            "tokens_per_s": median,
            "tokens_per_s_rounds": self.rates,
            "spread_percent": harness.spread(self.rates),
            "params": self.params,
            "warmup_seconds": self.warmup_seconds,
            "target_tokens_per_update": statistics.median(self.update_tokens),
            "mfu": median * flops_per_token / peaks[DTYPES[self.name]],
        }


def ratios(summaries):
    """Median over rounds of t2t_lite config / peer, for every measured pair."""
    out = {}
    for mine in (n for n in ALL_CONFIGS if n.startswith("t2t")):
        for peer in PEERS:
            a, b = summaries.get(mine, {}), summaries.get(peer, {})
            if "tokens_per_s_rounds" in a and "tokens_per_s_rounds" in b:
                out[f"{mine}/{peer}"] = harness.median_ratio(
                    a["tokens_per_s_rounds"], b["tokens_per_s_rounds"]
                )
    return out


def table_rows(summaries):
    """The harness's rows (tokens/s per round, ratio to t2t_f32) with the columns
    bench_peers adds: dtype, parameters, MFU, tokens per update, warmup seconds."""
    measured = {
        n: c["tokens_per_s_rounds"]
        for n, c in summaries.items()
        if "tokens_per_s_rounds" in c
    }
    errors = {
        n: f"{c['status']}: {c['reason']}"
        for n, c in summaries.items()
        if n not in measured
    }
    rows = harness.summary_rows(measured, "t2t_f32", errors)
    for row in rows:
        c = summaries[row["config"]]
        row["dtype"] = c["dtype"]
        if "error" not in row:
            warm = c["warmup_seconds"]
            row["params"] = c["params"] or 0
            row["MFU"] = f"{100 * c['mfu']:.1f}%"
            row["tok/update"] = f"{c['target_tokens_per_update']:.0f}"
            row["warmup s"] = f"{warm:.0f}" if warm else "-"
    return rows


TABLE_COLUMNS = ("dtype", "params", "MFU", "tok/update", "warmup s")
