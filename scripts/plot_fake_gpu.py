"""The fake-GPU figure: accumulation (b, n=8) against one big batch (8b, n=1) and a
small batch (b, n=1), trained with t2t-trainer and drawn with t2t-plot.

Three runs of a small Transformer (transformer_tiny with hidden 64, dropout on as in
a real run) on the built-in algorithmic_reverse problem, all for the same number of
UPDATES (--updates):

  fake_gpu     micro-batches of b tokens, optimizer_multistep_accumulate_steps=8:
               train_steps = 8 × updates micro-steps (docs/design.md §2: train_steps and
               local_eval_frequency count micro-steps)
  big_batch    batches of 8b tokens, n=1: train_steps = updates
  small_batch  batches of b tokens, n=1: train_steps = updates

The learning-rate schedule is evaluated in updates, so every run sees the same rate
at the same update. Each run evaluates on the whole dev set (--eval_steps=0) at the
same updates. Against updates, fake_gpu and big_batch should track each other (same
tokens per update, one length bucket so that both see the same mix of lengths; they
differ only in dropout masks and which examples fall into which update) while
small_batch, with 8 times fewer tokens per update, lags.

Run from the repository root (about 6½ minutes on 2 CPU cores, measured while other
jobs shared them; the fake-GPU run takes about half of it):

    python scripts/plot_fake_gpu.py

It writes the runs under --work_dir (runs there from an earlier call are deleted
first) and the figure to --plot_file (default scripts/figures/fake_gpu.png, the one
docs/curves.md shows).
"""

import argparse
import os
import shutil
import time

from benchkit.harness import ROOT, run_t2t

# One length bucket (min_length_bucket = max_length = 16 > the problem's 12 symbols
# + EOS): a batch of 8b tokens and 8 micro-batches of b then hold the same mix of
# sequence lengths. With T2T's length buckets a big batch is all one length while the
# 8 micro-batches of an update come from 8 buckets: different data per update (the
# fake-GPU run learned faster that way), not a difference in the arithmetic.
MODEL_HPARAMS = (
    "hidden_size=64,filter_size=256,num_heads=4,max_length=16,min_length_bucket=16,"
    "learning_rate_schedule=constant*linear_warmup*rsqrt_decay,"
    "learning_rate_constant=0.05,learning_rate_warmup_steps=100"
)


def _runs(args):
    """[(name, label, batch_size, n)] of the three runs."""
    b = args.batch_size
    return [
        ("fake_gpu", f"fake GPU: {b} tokens × n=8", b, 8),
        ("big_batch", f"big batch: {8 * b} tokens (n=1)", 8 * b, 1),
        ("small_batch", f"small batch: {b} tokens (n=1)", b, 1),
    ]


def train(args, name, batch_size, n):
    """Trains one run for args.updates updates; returns its seconds."""
    started = time.time()
    run_t2t(
        "trainer",
        "--problem=algorithmic_reverse",
        "--model=transformer",
        "--hparams_set=transformer_tiny",
        f"--hparams={MODEL_HPARAMS},batch_size={batch_size},"
        f"optimizer_multistep_accumulate_steps={n}",
        f"--output_dir={os.path.join(args.work_dir, name)}",
        f"--train_steps={n * args.updates}",
        f"--local_eval_frequency={n * args.eval_every}",
        "--eval_steps=0",
        f"--log_steps={n * args.log_every}",
        f"--save_checkpoints_steps={n * args.updates}",
        f"--random_seed={args.seed}",
        log=os.path.join(args.work_dir, f"{name}.log"),
    )
    return time.time() - started


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work_dir", default="/tmp/t2t_plot_fake_gpu")
    parser.add_argument(
        "--plot_file", default=os.path.join(ROOT, "scripts/figures/fake_gpu.png")
    )
    parser.add_argument("--batch_size", type=int, default=256, help="b, in tokens")
    parser.add_argument("--updates", type=int, default=400)
    parser.add_argument("--eval_every", type=int, default=40, help="in updates")
    parser.add_argument("--log_every", type=int, default=10, help="in updates")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    runs = _runs(args)
    os.makedirs(args.work_dir, exist_ok=True)
    started = time.time()
    for name, _, batch_size, n in runs:
        path = os.path.join(args.work_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)  # a finished run would only re-evaluate
        seconds = train(args, name, batch_size, n)
        print(f"{name}: {n * args.updates} micro-steps in {seconds:.0f} s", flush=True)
    print(
        run_t2t(
            "plot",
            "--output_dir=" + ",".join(os.path.join(args.work_dir, r[0]) for r in runs),
            "--labels=" + ",".join(r[1] for r in runs),
            f"--plot_file={args.plot_file}",
        ),
        end="",
    )
    print(f"total {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
