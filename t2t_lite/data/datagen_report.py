"""What t2t-datagen tells the user: progress lines and the end-of-run summary."""

import array
import time

import numpy as np

from t2t_lite.data import tfrecords

SPLIT_ORDER = ("train", "dev", "test")  # test only when datagen wrote one


class Progress:
    """Logs `label: done/total (pct), rate/s, ETA` every `every` items."""

    def __init__(self, label, total, every, log):
        self.label, self.total, self.every, self.log = label, total, every, log
        self.done = 0
        self.start = time.perf_counter()

    def add(self, count):
        before = self.done
        self.done += count
        if self.done // self.every > before // self.every:
            self.log(self.line())

    def rate(self):
        return self.done / max(time.perf_counter() - self.start, 1e-9)

    def line(self):
        rate = self.rate()
        if self.total:
            eta = max(self.total - self.done, 0) / max(rate, 1e-9)
            return (
                f"{self.label}: {self.done}/{self.total} "
                f"({100.0 * self.done / self.total:.0f}%), {rate:,.0f} pairs/s, "
                f"ETA {eta:.0f}s"
            )
        return f"{self.label}: {self.done}, {rate:,.0f} pairs/s"


class SplitStats:
    """Counts, drops and lengths of one split while it is written."""

    def __init__(self):
        self.written = 0
        self.shard_examples = []
        self.seconds = 0.0
        self.dropped = {}
        self.lengths = {"inputs": array.array("i"), "targets": array.array("i")}

    def drop(self, reason, count=1):
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def as_dict(self):
        return {
            "examples": self.written,
            "dropped": dict(sorted(self.dropped.items())),
            "tokens_per_example": {
                k: tfrecords.length_percentiles(v) for k, v in self.lengths.items()
            },
            "tokens": {
                k: int(np.sum(v, dtype=np.int64)) for k, v in self.lengths.items()
            },
        }


def make_summary(problem, vocabs, stats, config, seconds):
    train = stats["train"]
    return {
        "problem": problem.name,
        "vocab_size": max(v.size for v in vocabs.values()),
        "shared_vocab": config.shared_vocab,
        "seconds": round(seconds, 1),
        "train_seconds": round(train.seconds, 1),
        "train_pairs_per_second": round(train.written / max(train.seconds, 1e-9), 1),
        "splits": {split: s.as_dict() for split, s in stats.items()},
    }


def summary_lines(summary, data_dir):
    """The human-readable end-of-run summary printed by t2t-datagen."""
    lines = [f"{summary['problem']} in {data_dir}:"]
    if summary.get("skipped"):
        lines[0] += " (already complete; nothing was written)"
    lines.append(
        f"  vocabulary: {summary['vocab_size']} ids "
        f"({'shared' if summary['shared_vocab'] else 'separate'} source/target)"
    )
    for split in (name for name in SPLIT_ORDER if name in summary["splits"]):
        s = summary["splits"][split]
        dropped = ", ".join(f"{n} {why}" for why, n in s["dropped"].items()) or "none"
        lines.append(f"  {split}: {s['examples']} examples written; dropped: {dropped}")
        for side, p in s["tokens_per_example"].items():
            lines.append(
                f"    {side} tokens per example (EOS included): p50 {p['p50']}, "
                f"p90 {p['p90']}, p99 {p['p99']}, max {p['max']}, mean {p['mean']}"
            )
    lines.append(
        f"  time: {summary['seconds']}s total; encoding + writing train "
        f"{summary['train_pairs_per_second']:,.0f} pairs/s"
    )
    return lines
