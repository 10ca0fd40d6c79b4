"""The batch-size figure: a fixed large batch against a ramp to it, with the gradient
noise scale each measured, on the built-in translation problem
(translate_numbers_en_fr), trained with t2t-trainer and drawn with t2t-plot.

Two runs of transformer_tiny_fake_gpu4 (512-token micro-batches) for the same
--train_steps micro-batches, hence the same tokens:

  fixed  n=4 on every update: 2048 tokens per update
  ramp   batch_size_schedule=linear:512,2048,RAMP: from 1 micro-batch to 4 over
         RAMP updates (--ramp), then 4; more updates from the same tokens

The learning-rate schedule is evaluated in updates in both. The figure's rows are dev
loss and the noise scale, against updates, tokens trained on and time. Run from the
repository root (about 14 minutes on 2 CPU cores shared with other jobs):

    python scripts/plot_batch_schedule.py

It writes the data under --work_dir/data (kept between calls), the runs under
--work_dir (runs from an earlier call are deleted first) and the figure to
--plot_file (default scripts/figures/batch_schedule.png, the one docs/batch.md shows).
"""

import argparse
import os
import shutil
import time

from benchkit.harness import ROOT, run_t2t

PROBLEM = "translate_numbers_en_fr"


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work_dir", default="/tmp/t2t_plot_batch_schedule")
    parser.add_argument(
        "--plot_file", default=os.path.join(ROOT, "scripts/figures/batch_schedule.png")
    )
    parser.add_argument("--train_steps", type=int, default=2000)
    parser.add_argument("--ramp", type=int, default=200, help="in updates")
    args = parser.parse_args()

    data_dir = os.path.join(args.work_dir, "data")
    if not os.path.isdir(data_dir):
        run_t2t("datagen", f"--problem={PROBLEM}", f"--data_dir={data_dir}")
    runs = [
        ("fixed", "fixed: 2048 tokens/update (n=4)", ""),
        (
            "ramp",
            f"ramp: 512 to 2048 tokens/update over {args.ramp} updates",
            (
                "optimizer_multistep_accumulate_steps=1,"
                f"batch_size_schedule=linear:512,2048,{args.ramp}"
            ),
        ),
    ]
    for name, _, hparams in runs:
        path = os.path.join(args.work_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)  # a finished run would only re-evaluate
        started = time.time()
        run_t2t(
            "trainer",
            f"--problem={PROBLEM}",
            f"--data_dir={data_dir}",
            "--hparams_set=transformer_tiny_fake_gpu4",
            f"--hparams={hparams}",
            f"--output_dir={path}",
            f"--train_steps={args.train_steps}",
            "--local_eval_frequency=200",
            "--eval_steps=0",
            "--log_steps=100",
            f"--save_checkpoints_steps={args.train_steps}",
            log=os.path.join(args.work_dir, f"{name}.log"),
        )
        print(f"{name}: {time.time() - started:.0f} s")
    print(
        run_t2t(
            "plot",
            f"--output_dir={','.join(os.path.join(args.work_dir, r[0]) for r in runs)}",
            f"--labels={','.join(r[1] for r in runs)}",
            "--metrics=loss,noise_scale",
            f"--plot_file={args.plot_file}",
        )
    )


if __name__ == "__main__":
    main()
