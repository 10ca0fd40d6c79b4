"""bench_fit.py: the memory of a training step and the largest micro-batch that fits."""
