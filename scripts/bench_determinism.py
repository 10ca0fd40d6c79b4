"""What --deterministic costs: the quick-start run with and without it, side by side.

TF op determinism is process-wide and cannot be switched off again, so each variant
runs as its own `t2t-trainer` process, interleaved (rotating which goes first), and the
script prints each run's throughput (the median of its log lines' target tokens/s,
the first line, which includes tracing, excluded; start-up and evaluation are not in
them), the medians, and the median over rounds of the per-round ratio.

    python scripts/bench_determinism.py [--steps 600] [--repeats 2]   # ~3 min
"""

import argparse
import re
import statistics
import tempfile

from benchkit import harness

FLAGS = [
    "--problem=algorithmic_reverse",
    "--hparams_set=transformer_tiny_fake_gpu4",
    "--local_eval_frequency=0",
    "--eval_steps=1",
    "--log_steps=100",
    "--save_checkpoints_steps=100000",
]


def tokens_per_second(steps, deterministic):
    """Median tokens/s over the run's log lines, the first (tracing) one excluded."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            "-m",
            "t2t_lite.bin.trainer",
            *FLAGS,
            f"--train_steps={steps}",
            f"--output_dir={out}",
        ]
        if deterministic:
            command.append("--deterministic")
        _, log = harness.run_python(command)
    rates = [float(r) for r in re.findall(r"([\d.]+) tokens/s", log)]
    return statistics.median(rates[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=2)
    harness.add_json_flag(parser)
    args = parser.parse_args()
    results = {"default": [], "--deterministic": []}

    def run_one(name, round_index):
        rate = tokens_per_second(args.steps, name == "--deterministic")
        results[name].append(rate)
        print(f"round {round_index + 1} {name:>15}: {rate:.0f} tokens/s", flush=True)

    harness.print_start()
    harness.interleave(list(results), args.repeats, run_one)
    rows = harness.summary_rows(results, "default")
    title = (
        f"t2t-trainer throughput, {args.steps} steps, with and without --deterministic"
    )
    harness.print_table(title, rows, "tokens/s", "default")
    harness.write_json(args.json, "bench_determinism", rows, "tokens/s", "default")


if __name__ == "__main__":
    main()
