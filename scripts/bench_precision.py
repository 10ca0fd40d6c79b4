"""Does low precision train as well? float32 vs bfloat16 vs float16 on the numbers problem.

Trains the built-in translate_numbers_en_fr model (builds.train_numbers_model:
transformer_tiny, 3000 pairs) with each activation_dtype from the same seed for the
same number of updates, each in a fresh child process, and compares the final dev loss
(the goal for bfloat16: within 2% of float32), accuracy, BLEU, and the loss at the
halfway evaluation. Prints a table and one JSON line.

  python scripts/bench_precision.py                   # 600 steps, ~3 min on 2 cores
  python scripts/bench_precision.py --train_steps=1200 --dtypes=float32,bfloat16
"""

import argparse
import json
import os
import sys
import tempfile


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
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.train_steps)
    from benchkit import harness

    harness.print_start()
    results = {}
    for dtype in args.dtypes.split(","):
        out, _ = harness.run_python(  # the child inherits this process's PYTHONPATH
            [__file__, f"--child={dtype}", f"--train_steps={args.train_steps}"]
        )
        results[dtype] = harness.last_json(out)
    print(harness.environment())
    reference = results[args.dtypes.split(",")[0]]["final"]["loss"]
    summary = {}
    for dtype, result in results.items():
        final, curve = result["final"], result["curve"]
        ratio = final["loss"] / reference
        print(
            f"{dtype:<9} dev loss "
            + " -> ".join(f"{r['loss']:.4f} (update {r['update_step']})" for r in curve)
            + f"; final/first dtype {ratio:.4f}, accuracy {final['accuracy']:.4f}, "
            f"BLEU {final.get('bleu', float('nan')):.2f}"
        )
        summary[dtype] = {
            "final_loss": final["loss"],
            "loss_ratio": ratio,
            "accuracy": final["accuracy"],
            "bleu": final.get("bleu"),
            "updates": final["update_step"],
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
