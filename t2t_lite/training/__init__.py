"""Training, by where the code runs (docs/design.md §4). Imports run one way:

    cluster  →  step  →  reporting  →  opening  →  loop

- cluster/: which processes and devices train (tf.distribute strategy, TF_CONFIG,
  SLURM) and what happens when one of them is lost.
- step/: the compiled train step and what runs inside it, per replica: accumulate,
  update, out-of-memory splitting, loss scaling, the noise scale.
- reporting/: what the host measures and records: evaluation, throughput, best
  checkpoint and early stopping, TensorBoard and log lines.
- opening/: turning options into a run ready to train: TrainerOptions, build_training, the
  auto batch size, input iterators, TrainerSetup.
- loop/: the training loop over accumulation windows and its hooks.
"""
