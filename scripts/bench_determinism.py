"""What --deterministic costs: the quick-start run with and without it, side by side.

TF op determinism is process-wide and cannot be switched off again, so each variant
runs as its own `t2t-trainer` process, alternating, and the script prints the median
training throughput (target tokens/s from the trainer's own log lines, start-up and
evaluation excluded) and the ratio.

    python scripts/bench_determinism.py [--steps 600] [--repeats 2]
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile

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
            sys.executable,
            "-m",
            "t2t_lite.bin.trainer",
            *FLAGS,
            f"--train_steps={steps}",
            f"--output_dir={out}",
        ]
        if deterministic:
            command.append("--deterministic")
        log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    rates = [float(r) for r in re.findall(r"([\d.]+) tokens/s", log)]
    return statistics.median(rates[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    results = {False: [], True: []}
    for _ in range(args.repeats):
        for deterministic in (False, True):
            results[deterministic].append(tokens_per_second(args.steps, deterministic))
    plain = statistics.median(results[False])
    det = statistics.median(results[True])
    print(f"default        {plain:10.0f} tokens/s")
    print(f"--deterministic {det:9.0f} tokens/s")
    print(f"ratio deterministic/default: {det / plain:.3f}")


if __name__ == "__main__":
    main()
