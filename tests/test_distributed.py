"""MirroredStrategy over two logical CPUs: replicas × accumulation == one big batch."""

import json
import os
import subprocess
import sys


def test_mirrored_replicas_times_accumulation_equals_big_batch():
    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run(
        [sys.executable, os.path.join(here, "mirrored_equivalence.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=here,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["updates"] == 2 and report["micro_steps"] == 4
    assert report["adam_ratio"] < 1  # equal within 1e-5 relative (+ 1e-7 floor)
    assert report["momentum_ratio"] < 1
    # Replicas talk only on the update micro-step, in one all-reduce (of gradients,
    # loss and tokens together); the check sees that one, so it could see others.
    assert report["accumulate_cross_device_ops"] == 0
    assert report["update_cross_device_ops"] == 1
    # And the equivalence check can see a double all-reduce.
    assert report["double_reduce_ratio"] > 10
