"""Fixtures shared by test files: a small translation model and an uninterrupted
two-worker run, each trained once per session (once for all pytest-xdist workers).

Also the `slow` marker: `pytest -m "not slow" tests` is the fast inner loop (under two
minutes); CI runs everything. A test is slow when it trains for more than a few steps,
starts a subprocess (TensorFlow start-up, ~3 s), or uses `numbers_run` or
`two_worker_reference` (marked here, automatically, so a new user of the fixture
cannot forget).
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import random
import shutil
import tempfile

import pytest
from support.numbers_model import train_numbers_model
from support.workers import train_reference

from t2t_lite import registrations  # noqa: F401  (registers problems and sets)

# The suite's runs train on one host unless a test gives them a cluster: pytest run
# inside a SLURM step of several tasks, or under a TF_CONFIG, must not join them up.
for _name in [n for n in os.environ if n.startswith(("SLURM_", "SLURMD_"))]:
    del os.environ[_name]
os.environ.pop("TF_CONFIG", None)


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle",
        type=int,
        metavar="SEED",
        help="run the files, and the tests within each file, in an order drawn from "
        "SEED (instead of longest first): a test that passes only after, or only "
        "before, certain others fails under some seed",
    )


def pytest_report_header(config):
    seed = config.getoption("shuffle")
    if seed is not None:
        return f"test order shuffled with --shuffle={seed} (-n 0 replays it exactly)"
    return None


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: trains a model, starts a subprocess or uses numbers_run or "
        "two_worker_reference; deselect "
        'with -m "not slow" for a fast inner loop',
    )


# pytest-xdist's --dist loadfile runs each file on one worker and hands out files in
# order of their number of tests, so that a file of a few long tests (a subprocess
# fixture, a benchmark smoke run) would start last and keep one worker busy while the
# other idles. These files start first instead, longest first (measured on 2 cores);
# every other file follows in xdist's order. A file missing here is only scheduled
# later, never skipped.
LONGEST_FIRST = (
    "test_distributed_trainer.py",
    "test_crash_resume.py",
    "test_accumulation.py",
    "test_lost_worker.py",
    "test_mixed_precision.py",
    "test_distributed.py",
    "test_reliability.py",
    "test_trainer.py",
    "test_batch_schedule.py",
    "test_xla.py",
    "test_warm_start_and_versions.py",
    "test_bench_peers.py",
    "test_bench_recipes.py",
    "test_exporter.py",
    "test_auto_batch.py",
    "test_out_of_memory.py",
    "test_early_stopping.py",
    "test_recompute.py",
    "test_console.py",
    "test_cli_trainer.py",
    "test_test_split.py",
    "test_decoder_cli.py",
    "test_decoding.py",
    "test_datagen_cli.py",
    "test_plot.py",
    "test_averaging.py",
    "test_transformer.py",
    "test_memory.py",
)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: xdist may be absent
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile" or config.getoption("shuffle") is not None:
        return None  # xdist's own scheduler: files in collection order
    from xdist.scheduler import LoadFileScheduling

    def rank(scope):
        name = os.path.basename(scope)
        return (
            LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        )

    class LongestFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            # min() keeps xdist's order among files of equal rank.
            first = min(self.workqueue, key=rank)
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    seed = config.getoption("shuffle")
    if seed is not None:
        items[:] = _shuffled(items, random.Random(seed))
    for item in items:
        if {"numbers_run", "two_worker_reference"} & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.slow)


def _shuffled(items, rng):
    """`items` with their files in a random order and each file's tests shuffled
    among themselves; the same for every pytest-xdist worker (same seed), as xdist
    requires. Tests stay grouped by file, so --dist loadfile still runs a file on
    one worker."""
    files = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    groups = list(files.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    return [item for group in groups for item in group]


@dataclasses.dataclass
class NumbersRun:
    data_dir: str
    output_dir: str
    record: dict  # the final evaluation


@contextlib.contextmanager
def _exclusive(lock_path):
    """Holds an exclusive lock on `lock_path` (created if need be)."""
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def shared_across_workers(tmp_path_factory, config, name, make):
    """`make(directory)`'s JSON-able result, computed once per test session.

    Under pytest-xdist every worker runs its own session fixtures; this keys them on
    the session's common temporary folder, so the first worker to ask computes the
    result (the others wait for it under a file lock) and every worker gets the same
    files, which tests must only read. Without xdist it is an ordinary session-scoped
    computation."""
    base = tmp_path_factory.getbasetemp()
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        base = base.parent  # shared by the workers of this session only
    directory, done = base / name, base / f"{name}.json"
    with _exclusive(str(base / f"{name}.lock")):
        if not done.is_file():
            # A failed attempt's files must not seed this one (a run would resume).
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            done.write_text(json.dumps(make(str(directory)), default=float))
        return json.loads(done.read_text())


@pytest.fixture(scope="session", autouse=True)
def temp_files(tmp_path_factory):
    """Where temporary files go, in this process and the ones the tests start:
    under pytest's own folder, which pytest prunes, not the machine's. A process
    the tests kill cannot remove its own (AutoGraph writes each converted function
    to a temporary file and removes it at exit)."""
    folder = str(tmp_path_factory.mktemp("temp_files"))
    previous = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = folder
    yield
    tempfile.tempdir = previous[0]
    if previous[1] is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = previous[1]


@pytest.fixture(scope="session")
def numbers_run(tmp_path_factory, pytestconfig):
    """translate_numbers_en_fr (3000 training pairs, 200 dev) and transformer_tiny
    trained 300 steps with BLEU on 100 dev sentences at steps 150 and 300 (~20 s
    alone, ~60 s on a busy machine; scripts/benchkit/builds.py trains the same for the
    benchmarks). It reaches BLEU ~98: enough to tell a working decoder from a broken one.
    Trained once for all pytest-xdist workers; tests only read it."""
    made = shared_across_workers(
        tmp_path_factory,
        pytestconfig,
        "numbers",
        lambda root: list(train_numbers_model(root)),
    )
    return NumbersRun(*made)


@pytest.fixture(scope="session")
def two_worker_reference(tmp_path_factory, pytestconfig):
    """The output directory of support/workers.py's TWO_WORKER_RUN trained
    uninterrupted by two TF_CONFIG workers on 127.0.0.1 (checkpoints at 4, 8 and 12):
    what the stop-and-resume, lost-worker and SLURM runs must end with. Trained once
    for all pytest-xdist workers; tests only read it."""
    return shared_across_workers(
        tmp_path_factory, pytestconfig, "two_worker_reference", train_reference
    )
