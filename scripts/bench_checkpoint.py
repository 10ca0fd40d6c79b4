"""What a checkpoint costs by the size of the training shuffle buffer
(`shuffle_buffer_size`): the buffer's examples are part of every checkpoint, since a
resumed run continues with the examples it would have seen, and they are read
before the first step.

Each configuration (a buffer size) runs in a fresh process, interleaved over rounds.
The child builds a Trainer (--hparams_set on algorithmic_reverse, n=2), trains 4
micro-steps, then times --saves checkpoint saves (the trainer's own, the shuffle
buffer's state included) and, on a new iterator, its first batch. The table's
rows: the median CPU seconds of one save (the process's, all threads) and the ratio
to the first buffer size's, with the checkpoint's size and the first batch's wall
time as columns. --json writes the rows.

  python scripts/bench_checkpoint.py --rounds=3
  python scripts/bench_checkpoint.py --buffers=10000,1000,100 --saves=20
"""

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time

from benchkit import builds, harness


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--buffers", default="10000,1000", help="Buffer sizes, first = base."
    )
    p.add_argument("--saves", type=int, default=10, help="Timed saves per process.")
    p.add_argument("--hparams_set", default="transformer_test")
    p.add_argument("--config", default="", help=argparse.SUPPRESS)  # child mode
    harness.add_json_flag(p)
    args = p.parse_args(argv)
    args.buffer_list = [b.strip() for b in args.buffers.split(",") if b.strip()]
    if not args.buffer_list or not all(
        b.isdigit() and int(b) > 0 for b in args.buffer_list
    ):
        p.error(f"--buffers: positive integers, got {args.buffers!r}.")
    if args.rounds < 1 or args.saves < 1:
        p.error("--rounds and --saves must be >= 1.")
    return args


def child(args):
    from t2t_lite.training.loop.trainer import Trainer, TrainerOptions

    hp = builds.hparams(
        args.hparams_set,
        optimizer_multistep_accumulate_steps=2,
        shuffle_buffer_size=int(args.config),
    )
    output_dir = tempfile.mkdtemp(prefix="bench_checkpoint_")
    options = TrainerOptions(
        problem="algorithmic_reverse",
        model="transformer",
        output_dir=output_dir,
        train_steps=4,
        eval_steps=1,
        local_eval_frequency=0,
        save_checkpoints_steps=1000,
        log_steps=1000,
    )
    trainer = Trainer(options, hp)
    trainer.train()
    trainer.checkpoints.save(100)  # the first save after training, untimed
    cpu, wall = [], []
    for number in range(101, 101 + args.saves):
        began_cpu, began = time.process_time(), time.perf_counter()
        trainer.checkpoints.save(number)
        cpu.append(time.process_time() - began_cpu)
        wall.append(time.perf_counter() - began)
    (data,) = glob.glob(os.path.join(output_dir, f"model-{number}.data-*"))
    began = time.perf_counter()
    next(iter(trainer.dataset("train", training=True)))
    first_batch = time.perf_counter() - began
    out = {
        "save_cpu": statistics.median(cpu),
        "save_wall": statistics.median(wall),
        "checkpoint_mb": os.path.getsize(data) / 2**20,
        "first_batch": first_batch,
    }
    print(json.dumps(out))


def main(argv):
    args = parse(argv)
    if args.config:
        return child(args)
    harness.print_start()
    flags = [f"--saves={args.saves}", f"--hparams_set={args.hparams_set}"]
    results = harness.child_rounds(
        __file__, args.buffer_list, args.rounds, flags, label="checkpoint"
    )
    base = args.buffer_list[0]
    rows = harness.summary_rows(
        {b: [r["save_cpu"] for r in results[b]] for b in args.buffer_list}, base
    )
    for row in rows:
        runs = results[row["config"]]
        for key in ("save_wall", "checkpoint_mb", "first_batch"):
            row[key] = statistics.median(r[key] for r in runs)
    title = (
        f"A checkpoint save by shuffle_buffer_size ({args.hparams_set}, "
        "algorithmic_reverse): CPU seconds per save"
    )
    columns = ("save_wall", "checkpoint_mb", "first_batch")
    harness.print_table(title, rows, "s", base, columns)
    harness.write_json(args.json, "bench_checkpoint", rows, "s", base)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
