"""The training loop and its hooks. May import every other part of training/."""
