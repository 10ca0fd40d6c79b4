"""Which processes and devices train, and a lost one. Imports nothing else of training."""
