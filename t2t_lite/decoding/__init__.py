"""Decoding: greedy and beam search with a key/value cache, translation, BLEU."""
