"""Random kills of one worker of a two-worker run, then the same command again.

Each trial starts two `t2t-trainer` workers on 127.0.0.1 (TF_CONFIG, transformer_test,
n=3, checkpoints every 6 micro-steps, --deterministic), SIGKILLs one of them (workers
take turns as the victim) at a random moment after worker 0 logs its first step
(the start-up is left out: kills land in accumulate micro-steps, updates and saves
alike; by default anywhere up to the uninterrupted run's time from its first step to
its end, measured first), measures how
long the survivor takes to exit and keeps the last line it printed, then runs both
commands again to the end and compares the final checkpoint with an uninterrupted
run's (every variable but the input iterators; "exact" = equal to rtol 1e-5).

With --freeze the victim is SIGSTOPped instead: alive, sockets open, silent (a hung
machine); the survivor can only notice the missing heartbeats.

The report is the harness's table (benchkit/harness.py): the survivor's seconds from
the kill to its exit (median and spread over the trials), with the exact restarts and
the survivors' exit codes as columns, then the survivors' last lines; --json writes
the row and every trial.

  python scripts/bench_lost_worker.py --trials=20
  python scripts/bench_lost_worker.py --trials=6 --freeze
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchkit import harness
from benchkit.two_workers import max_relative_difference, state, worker_environments


def start(output_dir, train_steps, log_prefix):
    args = [
        sys.executable,
        "-m",
        "t2t_lite.bin.trainer",
        "--hparams_set=transformer_test",
        "--hparams=batch_size=64,max_length=16,optimizer_multistep_accumulate_steps=3",
        f"--output_dir={output_dir}",
        f"--train_steps={train_steps}",
        "--log_steps=1",
        "--save_checkpoints_steps=6",
        "--local_eval_frequency=0",
        "--eval_steps=1",
        "--deterministic",
    ]
    workers = []
    for index, env in enumerate(worker_environments()):
        log = open(f"{log_prefix}{index}.log", "w")  # noqa: SIM115 (the child's)
        workers.append(
            subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    return workers


def last_line(path):
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def when_first_step(workers, log):
    """The moment worker 0 logs its first step, or all workers have ended."""
    while any(w.poll() is None for w in workers):
        with open(log) as f:
            if "] step 1," in f.read():
                break
        time.sleep(0.1)
    return time.monotonic()


def trial(root, index, victim, kill_after, train_steps, reference, freeze=False):
    run = os.path.join(root, f"trial{index}")
    log = os.path.join(root, f"trial{index}-first-worker")
    workers = start(run, train_steps, log)
    began = when_first_step(workers, f"{log}0.log")
    while time.monotonic() - began < kill_after:
        if all(w.poll() is not None for w in workers):
            break
        time.sleep(0.1)
    result = {"victim": victim, "kill_after": round(kill_after, 1)}
    if workers[victim].poll() is not None:
        result["note"] = "the run ended before the kill"
    else:
        if freeze:  # alive with its sockets open, silent: a hung machine
            workers[victim].send_signal(signal.SIGSTOP)
        else:
            workers[victim].kill()
            workers[victim].wait()
        killed = time.monotonic()
        survivor = workers[1 - victim]
        try:
            result["survivor_exit"] = survivor.wait(timeout=300)
        except subprocess.TimeoutExpired:
            survivor.kill()
            result["survivor_exit"] = "hung (killed after 300 s)"
        result["survivor_seconds"] = round(time.monotonic() - killed, 1)
        result["survivor_line"] = last_line(f"{log}{1 - victim}.log")
        workers[victim].kill()  # a frozen victim, as an operator would
        workers[victim].wait()
    log = os.path.join(root, f"trial{index}-rerun-worker")
    codes = [w.wait(timeout=600) for w in start(run, train_steps, log)]
    result["rerun_exits"] = codes
    final = os.path.join(run, f"model-{train_steps}")
    if codes == [0, 0] and os.path.exists(final + ".index"):
        difference = max_relative_difference(state(final), reference)
        result["max_relative_difference"] = difference
        result["exact"] = difference <= 1e-5
    else:
        result["exact"] = False
        result["rerun_lines"] = [last_line(f"{log}{i}.log") for i in range(2)]
    shutil.rmtree(run, ignore_errors=True)
    return result


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--train_steps", type=int, default=90)
    p.add_argument(
        "--kill_seconds",
        default="",
        help="MIN,MAX after the first step (default: from 0 to the uninterrupted "
        "run's time from its first step to its end)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--freeze",
        action="store_true",
        help="SIGSTOP the victim instead (killed once the survivor has exited)",
    )
    harness.add_json_flag(p)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    harness.print_start()
    root = tempfile.mkdtemp(prefix="lost_worker_")
    began = time.monotonic()
    reference_run = os.path.join(root, "reference")
    workers = start(reference_run, args.train_steps, reference_run + "-worker")
    first_step = when_first_step(workers, reference_run + "-worker0.log")
    codes = [w.wait(timeout=600) for w in workers]
    assert codes == [0, 0], f"the uninterrupted run failed: {codes} (logs in {root})"
    training = time.monotonic() - first_step
    print(
        f"uninterrupted run: {time.monotonic() - began:.0f} s, "
        f"{training:.0f} s of them from its first step",
        flush=True,
    )
    low, high = 0.0, training
    if args.kill_seconds:
        low, high = (float(v) for v in args.kill_seconds.split(","))
    args.kill_seconds = f"{low:.0f}-{high:.0f}"
    reference = state(os.path.join(reference_run, f"model-{args.train_steps}"))
    results = []
    for index in range(args.trials):
        result = trial(
            root,
            index,
            index % 2,
            rng.uniform(low, high),
            args.train_steps,
            reference,
            freeze=args.freeze,
        )
        results.append(result)
        print(json.dumps(result), flush=True)
    report(args, results)
    shutil.rmtree(root, ignore_errors=True)


def report(args, results):
    """The harness's table: the survivor's seconds to exit after the kill (median
    and spread over trials), exact restarts and exit codes as columns; then the
    survivors' last lines."""
    config = "SIGSTOP one worker" if args.freeze else "SIGKILL one worker"
    killed = [r for r in results if "survivor_seconds" in r]
    seconds = {config: [r["survivor_seconds"] for r in killed]} if killed else {}
    errors = {} if killed else {config: "no kill landed: every run ended first"}
    rows = harness.summary_rows(seconds, errors=errors)
    for row in rows:
        row["trials"] = len(results)
        row["with a kill"] = len(killed)
        row["exact restarts"] = f"{sum(r['exact'] for r in results)}/{len(results)}"
        row["survivor exit codes"] = ", ".join(
            sorted({str(r["survivor_exit"]) for r in killed})
        )
    title = (
        f"Lost worker: the survivor's seconds from the kill to its exit, then an "
        f"exact restart? ({args.train_steps} steps, kills {args.kill_seconds} s "
        "after the first step)"
    )
    note = "spread: (max - min) / median over the trials with a kill"
    columns = ("trials", "with a kill", "exact restarts", "survivor exit codes")
    harness.print_table(title, rows, "s to exit", columns=columns, note=note)
    for line in sorted({r["survivor_line"] for r in killed}):
        print(f"  {sum(r['survivor_line'] == line for r in killed)}× {line}")
    harness.write_json(
        args.json, "bench_lost_worker", rows, "s to exit", trials=results
    )


if __name__ == "__main__":
    main(sys.argv[1:])
