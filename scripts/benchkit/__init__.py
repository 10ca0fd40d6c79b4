"""benchkit: what the benchmark scripts in scripts/ are made of. A script is an entry
point that imports this package (and t2t_lite), never another script.

- harness.py: the context line, interleaved rounds in rotating order, median, spread
  and per-round ratios, the one table format and JSON schema, fresh child processes.
- builds.py: runs, models and fixed batches built the trainer's way, seeded; the
  small translation model some benchmarks decode with.
- profiler.py: the TF profiler's time per op type.
- flops.py: a Transformer's training FLOPs and the machine's matmul peak (MFU).
- two_workers.py: TF_CONFIG clusters on 127.0.0.1 and the checkpointed state their
  runs are compared by (bench_lost_worker.py, bench_multiworker_save.py).
- peers/: the frameworks bench_peers.py and bench_fit.py compare t2t_lite with (the
  Keras 3 + keras-hub model, the OpenNMT-tf venv driver), the synthetic corpus they
  all train on, and bench_peers' worker processes and results.
- fit/: bench_fit.py's memory measurement, configurations, search and report.
- recipes/: bench_recipes.py's recipes, runs (child processes) and report.

Importing the package, or harness, peers.opennmt or recipes.report, imports no
TensorFlow: opennmt_recipe.py checks its flags before paying for it.
"""
