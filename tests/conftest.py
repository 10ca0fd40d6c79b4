"""Fixtures shared by test files: a small translation model trained once per session.

Also the `slow` marker: `pytest -m "not slow" tests` is the fast inner loop (under two
minutes); CI runs everything. A test is slow when it trains for more than a few steps,
starts a subprocess (TensorFlow start-up, ~3 s), or uses `numbers_run` (marked here,
automatically, so a new user of the fixture cannot forget).
"""

import dataclasses
import os
import sys

import pytest

from t2t_lite import registrations  # noqa: F401  (registers problems and sets)

# The numbers model is trained by the scripts' shared plumbing (the benchmarks train it
# too); scripts/ is not a package, so its folder goes on the path.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts"))
from benchlib import train_numbers_model


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: trains a model, starts a subprocess or uses numbers_run; deselect "
        'with -m "not slow" for a fast inner loop',
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "numbers_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@dataclasses.dataclass
class NumbersRun:
    data_dir: str
    output_dir: str
    record: dict  # the final evaluation


@pytest.fixture(scope="session")
def numbers_run(tmp_path_factory):
    """translate_numbers_en_fr (3000 training pairs, 200 dev) and transformer_tiny
    trained 300 steps with BLEU on 100 dev sentences at steps 150 and 300 (~20 s),
    by the function scripts/bench_decoding.py also uses. It reaches BLEU ~98: enough
    to tell a working decoder from a broken one."""
    root = tmp_path_factory.mktemp("numbers")
    return NumbersRun(*train_numbers_model(str(root)))
