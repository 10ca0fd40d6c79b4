"""Benchmark: batch plans ("recipes") trained for the SAME WALL TIME, compared by dev
loss and BLEU against wall time and against tokens trained on.

Every recipe trains the same model on the same data from the same seed; only the
batch plan (and, in the *_sqrt/*_tok variants, the learning-rate rule) differs. A
recipe is a name and an `--hparams` override string applied after the common one
(RECIPES below; `{b}`, `{b2}`, ... stand for 1, 2, ... times --batch_size):

  fixed1..fixed8   n = 1, 2, 4, 8 micro-batches per update
  ramp             batch_size_schedule=linear:{b},{b4},200: 1 to 4 micro-batches
                   over 200 updates, then fixed4's batch (docs/batch.md)
  adaptive         batch_size_schedule=adaptive:{b2},{b16},50: from 2 micro-batches,
                   following the measured noise scale every 50 updates, up to 16
  *_sqrt, *_linear learning_rate_batch_scaling=sqrt|linear (the rate scaled with the
                   tokens per update, against learning_rate_reference_tokens)
  *_tok            learning_rate_schedule_unit=tokens (warmup and decay in tokens)
  auto             the recipe of the recommended set transformer_base_auto (what it
                   changes over transformer_base; its micro-batch, half of
                   transformer_base's, becomes half of --batch_size)

--recipe NAME=HPARAMS adds one (repeatable); --recipes picks them ("all": the table).

Method. Each run is a fresh process pinned to one core (`taskset -c K`), started in
groups of as many runs as --cores (default 0,1: two side by side, so that each pair
shares the machine's memory and caches alike); more runs than cores run group after
group, and a last group with a core to spare gets a filler run (one more seed of the
reference recipe, reported only as noise). Inside, t2t_lite's Trainer trains with
one extra hook (scripts/benchkit/recipes/runs.py): a clock of training time that, at --marks
evenly spaced marks up to --minutes, lets the accumulation window in progress close,
records micro-steps, updates, tokens trained on (non-pad target tokens) and tokens
per update, and writes the weights, off the clock; training stops at the last mark.
The one-off start (tracing each step function, filling the shuffle buffer: the
first step of each kind less the second's time) is off the clock too. Only after
training does the same process evaluate each mark's weights (dev loss on the whole
dev split, greedy BLEU on --bleu_sentences dev sentences, and BLEU with
--final_decode_hparams at the last mark), so no recipe's training time pays for
evaluation. "core share" is a run's CPU time over its wall time between its first
and last mark: near 1 when the core was its own, lower when other processes took
turns on it; then equal wall time is not equal work (and groups run at different
times may get different shares), and --clock=cpu makes --minutes count the CPU
time each run got instead.

Reported (scripts/benchkit/recipes/report.py): per recipe, dev loss and BLEU at each mark
(equal wall time) and at equal tokens; the time and tokens each recipe takes to reach
the --reference recipe's final dev loss and its ratio to the reference's own time
(the goal for a recommended recipe: <= 0.7x); with --repeats N, N seeds per recipe
and their spread. A recipe that fails (e.g. an hparam this t2t_lite does not have)
shows its one-line error in the table; the others run on. Output: the Markdown
tables (also in WORK_DIR/report.md), the figure (--plot_file) and, last, a JSON line.

Defaults: 3+3 pre-norm layers of 256 (filter 1024, 4 heads, dropout 0.1; the model of
bench_peers.py) over transformer_tiny, micro-batches of 2048 tokens, the set's Noam
schedule (rsqrt of the width) with 100 warmup updates and transformer_base's peak
rate. Noam's peak is constant x width^-0.5 x warmup^-0.5, so shortening
transformer_base's 8000 warmup updates to 100 at its constant of 2 would multiply the
peak by sqrt(80), ~9x, far above the rates Transformers are trained at: there Adam's
steps bounce, the measured noise scale reads 3-6x higher, and large batches beat small
ones, an order that reverses at transformer_base's peak (docs/benchmarks.md, "Recipes
at equal time"). --learning_rate_constant therefore defaults to 2 x sqrt(warmup /
8000), which keeps that peak (0.0014 at width 256); 2 gives the short-warmup peak.
On one core of an AMD EPYC (Zen 4) to itself it trains ~1.3 micro-batches (~1,900
target tokens of the numbers problem) a second, so 25 minutes are ~2,000
micro-batches: ~500 updates for fixed4 and ~250 for fixed8, enough to leave warmup far
behind; a longer warmup would leave the large-batch recipes mostly inside it. For much
shorter budgets lower --warmup_steps.

Run (from the repository root):

  python scripts/bench_recipes.py                      # numbers en->fr, 25 min a run
  python scripts/bench_recipes.py --minutes 4 --warmup_steps 40 \\
      --recipes fixed1,fixed2,fixed4,fixed8,ramp,adaptive
  python scripts/bench_recipes.py --train_source=train.en --train_target=train.de \\
      --dev_source=dev.en --dev_target=dev.de --vocab_size=8000
  python scripts/bench_recipes.py --smoke              # tiny model, ~1 minute

The total time is (groups) x (--minutes + start-up + evaluation of the marks, ~1-5
minutes); the number of groups is printed at the start.
"""

import argparse
import json
import math
import os
import sys

from benchkit import harness
from benchkit.recipes import report as recipe_report
from benchkit.recipes import runs as recipe_runs
from benchkit.recipes.catalog import DEFAULT_RECIPES, RECIPES, set_recipe

from t2t_lite.errors import first_line

FIGURE = os.path.join(os.path.dirname(__file__), "figures", "bench_recipes.png")
SMOKE = {  # --smoke: a tiny model, two recipes, under a minute in all
    "hidden_size": 32,
    "filter_size": 64,
    "num_layers": 1,
    "num_heads": 2,
    "batch_size": 256,
    "warmup_steps": 10,
    "minutes": 0.1,
    "marks": 3,
    "recipes": "fixed4,adaptive",
    "bleu_sentences": 20,
    "final_decode_hparams": "beam_size=2",
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = p.add_argument_group("data")
    data.add_argument("--problem", default="translate_numbers_en_fr")
    for name in ("train_source", "train_target", "dev_source", "dev_target"):
        data.add_argument(f"--{name}", default="", help="parallel text (a path)")
    data.add_argument("--vocab_size", type=int, default=8000)
    data.add_argument("--data_dir", default="", help="data t2t-datagen already made")
    model = p.add_argument_group("model (as --hparams over --hparams_set)")
    model.add_argument("--hparams_set", default="transformer_tiny")
    model.add_argument("--hidden_size", type=int, default=256)
    model.add_argument("--filter_size", type=int, default=1024)
    model.add_argument("--num_layers", type=int, default=3)
    model.add_argument("--num_heads", type=int, default=4)
    model.add_argument("--dropout", type=float, default=0.1)
    model.add_argument("--batch_size", type=int, default=2048, help="micro-batch")
    model.add_argument("--warmup_steps", type=int, default=100, help="in updates")
    model.add_argument(
        "--learning_rate_constant",
        type=float,
        default=None,
        help="default: 2 x sqrt(warmup_steps / 8000), transformer_base's peak rate",
    )
    model.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    model.add_argument("--hparams", default="", help="more common overrides")
    runs = p.add_argument_group("recipes and runs")
    runs.add_argument("--recipes", default=DEFAULT_RECIPES, help='or "all"')
    runs.add_argument("--recipe", action="append", default=[], help="NAME=HPARAMS")
    runs.add_argument("--reference", default="fixed4")
    runs.add_argument("--minutes", type=float, default=25.0, help="training, per run")
    runs.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what --minutes counts: wall time, or the run's CPU time (for a "
        "machine whose cores other jobs share)",
    )
    runs.add_argument("--marks", type=int, default=10, help="evaluated checkpoints")
    runs.add_argument("--repeats", type=int, default=1, help="seeds per recipe")
    runs.add_argument("--random_seed", type=int, default=1)
    runs.add_argument("--cores", default="0,1", help="one run pinned to each")
    runs.add_argument("--bleu_sentences", type=int, default=500)
    runs.add_argument("--decode_hparams", default="beam_size=1", help="at marks")
    runs.add_argument("--final_decode_hparams", default="beam_size=4,alpha=0.6")
    out = p.add_argument_group("output")
    out.add_argument("--work_dir", default="/tmp/t2t_bench_recipes")
    out.add_argument("--plot_file", default="", help="default: " + FIGURE)
    out.add_argument("--keep_checkpoints", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny model, ~1 minute")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)  # a run's spec
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    smoke_figure = os.path.join(args.work_dir, "bench_recipes_smoke.png")
    args.plot_file = args.plot_file or (smoke_figure if args.smoke else FIGURE)
    return args


# --- checks before anything runs ------------------------------------------------------


def fail(message):
    """A mistake in the flags: one line, exit status 2."""
    print(f"bench_recipes.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    """One line for each mistake the runs would only find later."""
    if args.minutes <= 0 or args.marks < 1 or args.repeats < 1:
        fail("--minutes must be > 0, --marks and --repeats >= 1.")
    if not learning_rate_constant(args) > 0:
        fail("--learning_rate_constant and --warmup_steps must be > 0.")
    texts = [args.train_source, args.train_target, args.dev_source, args.dev_target]
    if any(texts) and not (args.train_source and args.train_target):
        fail("parallel text needs both --train_source and --train_target.")
    if bool(args.dev_source) != bool(args.dev_target):
        fail("give both --dev_source and --dev_target, or neither.")
    for path in filter(None, texts):
        if not os.path.isfile(path):
            fail(f"{path}: no such file.")
    if args.dtype == "bfloat16" and not recipe_runs.cpu_has_bfloat16():
        fail(
            "--dtype=bfloat16 needs a CPU with avx512_bf16 or AMX (see /proc/cpuinfo); "
            "this one has neither, and its bfloat16 would be slower than float32."
        )
    allowed = sorted(os.sched_getaffinity(0))
    cores = [c.strip() for c in args.cores.split(",")]
    if len(set(cores)) < len(cores) or any(c not in map(str, allowed) for c in cores):
        fail(f"--cores {args.cores}: give distinct cores of {allowed}, e.g. 0,1.")
    return [int(c) for c in cores]


def learning_rate_constant(args):
    """Noam's constant: the one given, else the one that keeps transformer_base's
    peak rate (constant 2 at 8000 warmup updates) at --warmup_steps."""
    if args.learning_rate_constant is not None:
        return args.learning_rate_constant
    from t2t_lite.registry import HPARAMS_SETS

    base = HPARAMS_SETS.get("transformer_base")()
    warmup = max(args.warmup_steps, 0) / base.learning_rate_warmup_steps
    return base.learning_rate_constant * math.sqrt(warmup)


def common_hparams(args):
    values = (
        f"hidden_size={args.hidden_size},filter_size={args.filter_size},"
        f"num_hidden_layers={args.num_layers},num_heads={args.num_heads},"
        f"layer_prepostprocess_dropout={args.dropout},attention_dropout={args.dropout},"
        f"relu_dropout={args.dropout},batch_size={args.batch_size},"
        f"learning_rate_warmup_steps={args.warmup_steps},"
        f"learning_rate_constant={learning_rate_constant(args):.6g},"
        f"activation_dtype={args.dtype}"
    )
    return ",".join(filter(None, [values, args.hparams]))


def chosen_recipes(args):
    """{name: hparams with {b}, {b2}, ... filled in}, the reference included."""
    table = dict(RECIPES)
    for item in args.recipe:
        name, sep, hparams = item.partition("=")
        if not sep or not name.strip():
            fail(f"--recipe {item!r}: expected NAME=HPARAMS.")
        table[name.strip()] = hparams
    names = list(table) if args.recipes == "all" else args.recipes.split(",")
    names += [
        n.partition("=")[0] for n in args.recipe if n.partition("=")[0] not in names
    ]
    if args.reference not in names:
        names.insert(0, args.reference)
    unknown = [n for n in names if n not in table]
    if unknown:
        fail(f"unknown recipe(s) {', '.join(unknown)}; known: {', '.join(table)}")
    sizes = {f"b{k}" if k > 1 else "b": k * args.batch_size for k in (1, 2, 4, 8, 16)}
    sizes["auto"] = set_recipe("transformer_base_auto", args.batch_size)
    return {name: table[name].format(**sizes) for name in names}


def validation_error(args, hparams):
    """The first line of what t2t-trainer would say about these hparams, or None."""
    try:
        recipe_runs.build_hparams(args.hparams_set, common_hparams(args), hparams)
    except Exception as e:  # noqa: BLE001  (a recipe's failure, reported in its row)
        return f"{type(e).__name__}: {first_line(e)}"
    return None


# --- running the jobs --------------------------------------------------------------


def plan_jobs(args, recipes, runnable):
    """[(recipe, seed, filler)]: every runnable recipe once per seed, seed by seed,
    plus filler runs of the reference recipe up to a multiple of the core count."""
    jobs = [
        (name, args.random_seed + r, False)
        for r in range(args.repeats)
        for name in recipes
        if name in runnable
    ]
    spare = -len(jobs) % len(args.cores_list)
    filler = (
        args.reference if args.reference in runnable else next(iter(runnable), None)
    )
    if jobs and filler:
        seed = args.random_seed + args.repeats
        jobs += [(filler, seed + k, True) for k in range(spare)]
    return jobs


def mark_seconds(args):
    """The marks, in seconds of training: --marks evenly spaced up to --minutes."""
    total = args.minutes * 60
    return [round(total * (i + 1) / args.marks, 3) for i in range(args.marks)]


def job_spec(args, problem, data_dir, recipe, hparams, seed, filler, core):
    tag = f"{recipe}-seed{seed}{'-filler' if filler else ''}"
    return {
        "recipe": recipe,
        "hparams": hparams,
        "seed": seed,
        "filler": filler,
        "core": core,
        "dir": os.path.join(args.work_dir, "runs", tag),
        "problem": problem,
        "data_dir": data_dir,
        "hparams_set": args.hparams_set,
        "common_hparams": common_hparams(args),
        "mark_seconds": mark_seconds(args),
        "clock": args.clock,
        "log_steps": 50,
        "bleu_sentences": args.bleu_sentences,
        "decode_hparams": args.decode_hparams,
        "final_decode_hparams": args.final_decode_hparams,
        "keep_checkpoints": args.keep_checkpoints,
    }


def run_jobs(args, problem, data_dir, recipes, jobs):
    """Runs the jobs in groups of one per core, each group to its end; returns
    their results in job order."""
    results, cores = [], args.cores_list
    groups = [jobs[i : i + len(cores)] for i in range(0, len(jobs), len(cores))]
    for number, group in enumerate(groups, 1):
        specs = [
            job_spec(args, problem, data_dir, name, recipes[name], seed, filler, core)
            for (name, seed, filler), core in zip(group, cores)
        ]
        print(f"group {number}/{len(groups)}:", flush=True)
        results += recipe_runs.run_group(specs, os.path.abspath(__file__))
    return results


# --- the benchmark -----------------------------------------------------------------


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        recipe_runs.child_main(args.child)
        return 0
    args.cores_list = check_args(args)
    recipes = chosen_recipes(args)
    os.makedirs(args.work_dir, exist_ok=True)
    harness.print_start()
    problem, data_dir = recipe_runs.prepare_data(args)
    errors = {
        name: validation_error(args, hparams) for name, hparams in recipes.items()
    }
    runnable = [name for name in recipes if errors[name] is None]
    jobs = plan_jobs(args, recipes, runnable)
    groups = -(-len(jobs) // len(args.cores_list))
    print(
        f"{problem}, {len(recipes)} recipes ({len(runnable)} runnable), "
        f"{args.repeats} seed(s): {len(jobs)} runs of {args.minutes:g} min training, "
        f"{len(args.cores_list)} at a time pinned to cores {args.cores} "
        f"({groups} group(s) one after another: {groups * args.minutes:g} min of "
        f"training ({args.clock} clock), plus start-up and evaluation)",
        flush=True,
    )
    for name, error in errors.items():
        if error:
            print(f"  {name}: not run: {error}", flush=True)
    results = run_jobs(args, problem, data_dir, recipes, jobs)
    for name in recipes:
        if errors[name]:
            results.append(recipe_runs.failed(name, recipes[name], errors[name]))
    summary = recipe_report.summarize(
        results, recipes, args.reference, mark_seconds(args), args.clock
    )
    text = recipe_report.markdown(summary)
    print(f"\n{harness.environment()}\n\n{text}\n", flush=True)
    with open(os.path.join(args.work_dir, "report.md"), "w") as f:
        f.write(text + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.plot_file)), exist_ok=True)
    title = (
        f"{problem}: {args.num_layers}+{args.num_layers} layers of {args.hidden_size}, "
        f"micro-batch {args.batch_size}, {args.dtype}, {args.minutes:g} min per run, "
        f"one core each, {len(args.cores_list)} side by side"
    )
    recipe_report.plot(summary, args.plot_file, title)
    print(f"figure: {args.plot_file}", flush=True)
    summary.update(
        benchmark="bench_recipes",
        problem=problem,
        minutes=args.minutes,
        cores=args.cores_list,
        dtype=args.dtype,
        common_hparams=common_hparams(args),
        figure=args.plot_file,
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
