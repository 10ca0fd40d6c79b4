"""Does low precision train as well? float32 vs bfloat16 vs float16 on the numbers problem.

Trains the built-in translate_numbers_en_fr model (builds.train_numbers_model:
transformer_tiny, 3000 pairs) with each activation_dtype from the same seed for the
same number of updates, each in a fresh child process, and compares the final dev loss
(the goal for bfloat16: within 2% of float32), accuracy, BLEU, and the loss at the
halfway evaluation. Prints the harness's table (one training run per dtype, final dev
loss and its ratio to the first dtype's), each dtype's loss curve, and one JSON line;
--json writes the rows.

  python scripts/bench_precision.py                   # 600 steps, ~3 min on 2 cores
  python scripts/bench_precision.py --train_steps=1200 --dtypes=float32,bfloat16
"""

import argparse
import json
import os
import sys
import tempfile

from benchkit import harness


def child(dtype, train_steps):
    from benchkit import builds

    with tempfile.TemporaryDirectory() as root:
        _, output_dir, final = builds.train_numbers_model(
            root, f"activation_dtype={dtype}", train_steps=train_steps
        )
        with open(os.path.join(output_dir, "metrics.jsonl")) as f:
            curve = [json.loads(line) for line in f]
    print(json.dumps({"final": final, "curve": curve}))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    p.add_argument("--train_steps", type=int, default=600)
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    harness.add_json_flag(p)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.train_steps)
    harness.print_start()
    results = {}
    for dtype in args.dtypes.split(","):
        out, _ = harness.run_python(  # the child inherits this process's PYTHONPATH
            [__file__, f"--child={dtype}", f"--train_steps={args.train_steps}"]
        )
        results[dtype] = harness.last_json(out)
    report(args, results)


def report(args, results):
    """The harness's table of final dev losses (ratio to the first dtype's), with
    accuracy, BLEU and updates; then each dtype's loss curve."""
    baseline = args.dtypes.split(",")[0]
    losses = {dtype: [r["final"]["loss"]] for dtype, r in results.items()}
    rows = harness.summary_rows(losses, baseline)
    summary = {}
    for row in rows:
        final = results[row["config"]]["final"]
        row["accuracy"] = final["accuracy"]
        row["BLEU"] = final.get("bleu")
        row["updates"] = final["update_step"]
        summary[row["config"]] = {
            "final_loss": final["loss"],
            "loss_ratio": row["ratio"],
            "accuracy": final["accuracy"],
            "bleu": final.get("bleu"),
            "updates": final["update_step"],
        }
    title = f"Final dev loss by activation dtype, translate_numbers_en_fr, {args.train_steps} steps"
    note = (
        "one training run per dtype, same seed; ratio: final loss / the first dtype's"
    )
    columns = ("accuracy", "BLEU", "updates")
    harness.print_table(title, rows, "dev loss", baseline, columns, note=note)
    for dtype, result in results.items():
        curve = " -> ".join(
            f"{r['loss']:.4f} (update {r['update_step']})" for r in result["curve"]
        )
        print(f"{dtype:<9} dev loss {curve}")
    harness.write_json(
        args.json, "bench_precision", rows, "dev loss", baseline, curves=results
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
