"""A run's directory on disk: hparams/run identity, metrics, checkpoints, averaging.

Below both decoding and training: the trainer writes runs, the decoder and the
averager read them, and neither needs the other to do so.
"""
