"""What a child process of bench_fit.py does: one configuration's steps at every
micro-batch size (and, in the last round, the search for the largest one under the
budget), or t2t_lite's own auto-fit. Each prints one JSON line, its result.

The children take bench_fit.py's parsed flags (`args`): they are the same program."""

import json
import time

from benchkit import builds
from benchkit.fit.configs import batch_of, build_config, step_record
from benchkit.fit.search import prediction, search
from benchkit.memory import GB
from benchkit.peers.t2t_session import t2t_hparams


def spec_of(args):
    """The model and batching every child builds (bench_peers' spec keys)."""
    return {
        "hidden_size": args.hidden_size,
        "filter_size": args.filter_size,
        "num_layers": args.layers,
        "num_heads": args.num_heads,
        "vocab_size": args.vocab_size,
        "dropout": args.dropout,
        "label_smoothing": 0.1,
        "batch_size": max(args.micro_batches),
        "max_tokens": args.length,
        "accumulate_steps": 2,
        "seed": args.seed,
    }


def measure_sizes(args, config, spec, result):
    """One step at every --micro_batches size, smallest first (--time_windows steps
    at --time_tokens, for the step time), recorded into `result`."""
    for sentences in (t // args.length for t in args.micro_batches):
        data = config.prepare(batch_of(sentences, spec))
        tokens = sentences * args.length
        windows = args.time_windows if tokens == args.time_tokens else 1
        for w in range(windows):
            record = step_record(config.window(data))
            if w == 0:
                result["steps"].append({"tokens": tokens, **record})
            if tokens == args.time_tokens:
                result["timed"].append(record["seconds"])
                result["timed_cpu"].append(record["cpu_seconds"])
        del data


def largest_fit(args, config, spec, steps):
    """The search for the largest micro-batch whose step peaks under --budget_gb,
    starting where the measured `steps` predict; its probes."""
    budget = args.budget_gb * GB
    guess, slope = prediction(steps, budget, args.length) or (1, None)
    probes = []

    def measure(sentences):
        data = config.prepare(batch_of(sentences, spec))
        record = step_record(config.window(data))
        del record["micro"]
        probes.append({"sentences": sentences, **record})
        return record["peak"]

    largest, _ = search(measure, budget, guess, slope, args.max_sentences)
    return {
        "budget_bytes": budget,
        "predicted": guess,
        "largest_sentences": largest,
        "largest_tokens": largest * args.length,
        "probes": probes,
    }


def child_steps(args, name):
    """A configuration's steps at every --micro_batches size; with --fit, then the
    search for the largest micro-batch under --budget_gb."""
    started = time.perf_counter()
    spec = spec_of(args)
    config = build_config(name, spec)
    built = time.perf_counter() - started
    warm = time.perf_counter()
    smallest = min(args.micro_batches) // args.length
    config.window(config.prepare(batch_of(smallest, spec)))
    result = {
        "config": name,
        "build_seconds": built,
        "warmup_seconds": time.perf_counter() - warm,
        "state": config.state(),
        "steps": [],
        "timed": [],
        "timed_cpu": [],
    }
    measure_sizes(args, config, spec, result)
    if args.fit:
        result["fit"] = largest_fit(args, config, spec, result["steps"])
    result["seconds"] = time.perf_counter() - started
    print(json.dumps(result))


def child_autofit(args, name):
    """probe_batch_size under --budget_gb, alone in this process."""
    from t2t_lite.optim.batch_plan import largest_micro_batch
    from t2t_lite.training.opening.auto_batch import probe_batch_size

    started = time.perf_counter()
    spec = spec_of(args)
    hp = t2t_hparams(spec, "float32").override(
        recompute_grad=name == "t2t_recompute",
        batch_size=0,
        effective_batch_size=32 * max(args.micro_batches),
        optimizer_multistep_accumulate_steps=1,
        max_length=args.length,
    )
    # The probe runs on the run itself, built with one sentence per micro-batch.
    provisional = hp.copy().override(batch_size=args.length + 1)
    parts = builds.build_seeded_parts(
        provisional, spec["vocab_size"], 100000, spec["seed"]
    )
    found = probe_batch_size(
        parts,
        memory_budget_gb=args.budget_gb,
        headroom=0.1,
        tokens_per_update=largest_micro_batch(hp, 1),
    )
    result = {
        "config": name,
        "batch_size": found.batch_size,
        "sentences": found.sentences,
        "largest_sentences": found.largest_sentences,
        "max_length": found.max_length,
        "limit": found.limit,
        "probe_seconds": found.probe_seconds,
        "probes": found.probes,
        "line": found.line(),
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result))
