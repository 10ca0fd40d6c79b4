"""Train step, evaluation, checkpoints, summaries and the training loop."""
