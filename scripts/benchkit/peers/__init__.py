"""The frameworks t2t_lite is measured against, and what bench_peers.py runs them on."""
