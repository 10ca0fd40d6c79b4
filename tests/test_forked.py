"""tests/support/forked.py: a child of the fork server runs its command line as a
fresh Python would (argv, sys.path, working directory, environment, streams, exit
status, signals, Python's exit steps), with TensorFlow already imported."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from support import forked

pytestmark = pytest.mark.slow  # starts the fork server (TensorFlow's import) once


@pytest.fixture(autouse=True)
def _forking(monkeypatch):
    """These tests are of the fork server, whatever the suite's switch says."""
    monkeypatch.delenv("T2T_LITE_TEST_FRESH_PROCESSES", raising=False)


def _script(tmp_path, body, name="child.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_script_sees_what_a_fresh_python_would(tmp_path):
    script = _script(
        tmp_path,
        """
        import json, os, sys, tempfile
        preloaded = "tensorflow" in sys.modules
        print(json.dumps({
            "argv": sys.argv, "orig_argv": sys.orig_argv, "path0": sys.path[0],
            "path1": sys.path[1], "cwd": os.getcwd(), "env": os.environ.get("WHO"),
            "main": __name__, "preloaded": preloaded, "temp": tempfile.gettempdir(),
        }))
        """,
    )
    other, temp = tmp_path / "elsewhere", tmp_path / "temp"
    other.mkdir()
    temp.mkdir()
    environment = {"WHO": "child", "PYTHONPATH": "/somewhere", "TMPDIR": str(temp)}
    result = forked.run(
        [sys.executable, script, "--flag", "x y"],
        capture_output=True,
        text=True,
        cwd=other,
        env={**os.environ, **environment},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["argv"] == [script, "--flag", "x y"]
    assert seen["orig_argv"] == [sys.executable, script, "--flag", "x y"]
    assert (seen["path0"], seen["path1"]) == (str(tmp_path), "/somewhere")
    assert (seen["cwd"], seen["env"], seen["main"]) == (str(other), "child", "__main__")
    assert seen["temp"] == str(temp)
    assert seen["preloaded"]  # forked from the server, not a fresh Python


def test_python_m_runs_the_module_as_main_from_the_working_directory(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    _script(
        tmp_path / "pkg",
        "import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n",
        name="tool.py",
    )
    result = forked.run(
        [sys.executable, "-m", "pkg.tool", "a"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (0, f"__main__ ['a'] {tmp_path}\n")


@pytest.mark.parametrize(
    "body, code, stderr",
    [
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('no good')", 1, "no good\n"),
        ("raise ValueError('bug')", 1, "ValueError: bug"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9, ""),
    ],
)
def test_exit_status_is_a_fresh_pythons(tmp_path, body, code, stderr):
    script = _script(tmp_path, body + "\n")
    result = forked.run([sys.executable, script], capture_output=True, timeout=120)
    assert result.returncode == code
    assert stderr.encode() in result.stderr
    if code == 1 and "Error" in stderr:
        assert b"Traceback (most recent call last)" in result.stderr


def test_pipes_stream_and_exit_steps_run(tmp_path):
    """A line is read while the child still runs; the child then reads stdin to its
    end and echoes it (more than a pipe holds, both ways); a thread pool's pending
    work is done and atexit runs, in that order, as Python ends."""
    script = _script(
        tmp_path,
        """
        import atexit, concurrent.futures, sys, time
        print("ready", flush=True)
        text = sys.stdin.read()
        atexit.register(lambda: print("atexit"))
        pool = concurrent.futures.ThreadPoolExecutor(1)
        pool.submit(lambda: (time.sleep(0.2), print("pool")))
        print(text.upper(), file=sys.stderr)
        """,
    )
    process = forked.popen(
        [sys.executable, script], stdin=forked.PIPE, stdout=forked.PIPE,
        stderr=forked.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline() == "ready\n"
    assert process.poll() is None  # waiting for its stdin
    text = "hello " * 30000  # 180 kB
    out, err = process.communicate(text, timeout=120)
    assert (process.returncode, out, err) == (0, "pool\natexit\n", text.upper() + "\n")


def test_input_for_a_child_that_does_not_read_it_is_dropped(tmp_path):
    script = _script(tmp_path, "pass\n")
    result = forked.run([sys.executable, script], input=b"x" * 200_000, timeout=60)
    assert result.returncode == 0


def test_processes_started_one_after_the_other_hash_strings_differently(tmp_path):
    """As two fresh Pythons: the servers take turns (each its own hash seed)."""
    script = _script(tmp_path, "print(hash('t2t_lite'))\n")
    hashes = [
        forked.run([sys.executable, script], capture_output=True, timeout=60).stdout
        for _ in range(3)
    ]
    assert hashes[0] != hashes[1] and hashes[1] != hashes[2]
    seeded = [sys.executable, script]
    assert not forked.forkable(seeded, {**os.environ, "PYTHONHASHSEED": "0"})


def test_signals_reach_the_child_and_wait_times_out(tmp_path):
    script = _script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    log = tmp_path / "log"
    with open(log, "w") as out:
        process = forked.popen([sys.executable, script], stdout=out)
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM
    assert log.read_text() == "up\n"


def test_other_command_lines_and_the_switch_use_subprocess(tmp_path, monkeypatch):
    command = [sys.executable, "-c", "pass"]
    assert not forked.forkable(command)
    with forked.popen(command) as process:
        assert isinstance(process, subprocess.Popen)
    script = [sys.executable, _script(tmp_path, "pass\n")]
    assert forked.forkable(script)
    monkeypatch.setenv("T2T_LITE_TEST_FRESH_PROCESSES", "1")
    assert not forked.forkable(script)
