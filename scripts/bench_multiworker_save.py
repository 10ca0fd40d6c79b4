"""What a checkpoint save costs a worker of a multi-host run: the trainer's save
(the replica-local sums gathered in packed all-reduces, TrainStep.checkpoint_stand_ins)
against TF reading every replica-local variable itself (three reductions per
variable per save, each a collective across workers).

Each round starts, per configuration (in rotating order), two `t2t-trainer` workers on
127.0.0.1 (TF_CONFIG; transformer_test, n=2, --deterministic) that save after every
micro-step. Each worker times every save it makes (wall and process CPU seconds,
all threads); the first save of a process is left out (it traces what later saves
reuse). A row is a configuration: the median over rounds of the median save of
both workers, with the ratio to the trainer's save. The column "same" is the largest
relative difference between the two configurations' final checkpoints of a round
(every tensor but the input iterators): the saves write the same state.

  python scripts/bench_multiworker_save.py --rounds=3
  python scripts/bench_multiworker_save.py --rounds=5 --steps=24
"""

import argparse
import atexit
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchkit import harness
from benchkit.two_workers import max_relative_difference, state, worker_environments

CONFIGS = ("gathered", "per_variable")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12, help="Micro-steps (and saves).")
    p.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    p.add_argument("--timings", default="", help=argparse.SUPPRESS)
    harness.add_json_flag(p)
    args, trainer_flags = p.parse_known_args(argv)
    if args.rounds < 1 or args.steps < 2:
        p.error("--rounds must be >= 1 and --steps >= 2.")
    return args, trainer_flags


def child(args, trainer_flags):
    """One worker: t2t-trainer with its saves timed (and, for per_variable, TF
    reading the replica-local variables itself)."""
    from t2t_lite.bin import trainer
    from t2t_lite.training.opening.trainer_setup import TrainerSetup
    from t2t_lite.training.step.train_step import TrainStep

    if args.child == "per_variable":
        TrainStep.checkpoint_stand_ins = lambda self: {}
    timings, save = [], TrainerSetup.save

    def timed_save(self):
        wall, cpu = time.perf_counter(), time.process_time()
        path = save(self)
        timings.append([time.perf_counter() - wall, time.process_time() - cpu])
        return path

    def write_timings():
        with open(args.timings, "w") as f:
            json.dump(timings, f)

    TrainerSetup.save = timed_save
    atexit.register(write_timings)
    sys.argv = [sys.argv[0], *trainer_flags]
    trainer.run()


def launch(config, run_dir, steps):
    """The two workers of one run of `config`; returns their timing files."""
    files, workers = [], []
    for index, env in enumerate(worker_environments()):
        files.append(os.path.join(run_dir, f"timings{index}.json"))
        command = [
            sys.executable, os.path.abspath(__file__), f"--child={config}",
            f"--timings={files[-1]}", "--hparams_set=transformer_test",
            "--hparams=batch_size=64,max_length=16,"
            "optimizer_multistep_accumulate_steps=2",
            f"--output_dir={run_dir}/run", f"--train_steps={steps}",
            "--save_checkpoints_steps=1", "--log_steps=1000",
            "--local_eval_frequency=0", "--eval_steps=1", "--deterministic",
        ]  # fmt: skip
        log = open(os.path.join(run_dir, f"worker{index}.log"), "w")  # noqa: SIM115
        workers.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
    codes = [w.wait(timeout=600) for w in workers]
    if codes != [0, 0]:
        raise RuntimeError(f"{config}: workers exited with {codes}; logs in {run_dir}")
    return files


def main(argv=None):
    args, trainer_flags = parse(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child(args, trainer_flags)
    harness.print_start()
    root = tempfile.mkdtemp(prefix="bench_multiworker_save_")
    wall = {c: [] for c in CONFIGS}
    cpu = {c: [] for c in CONFIGS}

    def run_one(config, round_index):
        run_dir = os.path.join(root, f"{config}-{round_index}")
        os.makedirs(run_dir)
        saves = []
        for path in launch(config, run_dir, args.steps):
            with open(path) as f:
                saves += json.load(f)[1:]  # the first save traces
        wall[config].append(statistics.median(s[0] for s in saves))
        cpu[config].append(statistics.median(s[1] for s in saves))

    harness.interleave(CONFIGS, args.rounds, run_one, label="round")
    same = [
        max_relative_difference(
            *[state(f"{root}/{c}-{i}/run/model-{args.steps}") for c in CONFIGS]
        )
        for i in range(args.rounds)
    ]
    rows = harness.summary_rows(cpu, baseline="gathered")
    for row in rows:
        row["wall s"] = statistics.median(wall[row["config"]])
    rows[0]["same"] = f"{max(same):.1e}"
    harness.print_table(
        f"CPU seconds of one save per worker, two TF_CONFIG workers, "
        f"transformer_test, {args.steps} saves per run",
        rows,
        "CPU s",
        baseline="gathered",
        columns=("wall s", "same"),
    )
    harness.write_json(args.json, "bench_multiworker_save", rows, "CPU s", "gathered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
