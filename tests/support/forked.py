"""`Popen` and `run`, as subprocess's, for the suite's `python -m MODULE` and
`python SCRIPT` command lines, whose processes start without importing TensorFlow.

Each such process is forked from a server (tests/support/fork_server.py, one per
test process, started on first use) that has imported TensorFlow, Keras,
tensorflow_datasets and t2t_lite once: a fresh Python pays 3 to 5 s of CPU for
that, some fifty times a run. The child then runs the command as a fresh Python
would: its own working directory, environment, sys.path, argv, streams and exit
status, signals delivered to its pid, Python's exit steps at the end. What it
shares with the server is what those imports did: modules imported once, so an
environment variable TensorFlow reads only at import (TF_CPP_MIN_LOG_LEVEL, or
T2T_LITE_TF_LOGS for t2t_lite's quiet start) has the server's value, and every child
runs with TensorFlow's start-up as quiet as a t2t_lite CLI's. Tests of those
start-up effects use subprocess itself; so does any other command line, and
everything with T2T_LITE_TEST_FRESH_PROCESSES=1.

Pipes are named pipes the server opens for the child, so a test reads a child's
output as it comes, as from a subprocess pipe.
"""

import atexit
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
_SERVER_SCRIPT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "fork_server.py"
)
_FRESH = "T2T_LITE_TEST_FRESH_PROCESSES"


def forkable(args):
    """Whether `args` is a command line the server runs: `python -m MODULE ...` or
    `python SCRIPT.py ...` with this Python."""
    args = [os.fspath(a) for a in args]
    return (
        os.environ.get(_FRESH, "") in ("", "0")
        and len(args) >= 2
        and args[0] == sys.executable
        and ((args[1] == "-m" and len(args) >= 3) or args[1].endswith(".py"))
    )


def popen(
    args, *, stdin=None, stdout=None, stderr=None, env=None, cwd=None, text=False
):
    """subprocess.Popen(args, ...) for the arguments the suite uses; forked from the
    server when `forkable(args)`."""
    if not forkable(args):
        return subprocess.Popen(
            args, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, text=text
        )
    return ForkedProcess(args, stdin, stdout, stderr, env, cwd, text)


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kw):
    """subprocess.run for the arguments the suite uses (see `popen`)."""
    if capture_output:
        kw["stdout"] = kw["stderr"] = PIPE
    if input is not None:
        kw["stdin"] = PIPE
    with popen(args, **kw) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


class ForkedProcess:
    """The parts of subprocess.Popen the suite uses, for a child of the server."""

    def __init__(self, args, stdin, stdout, stderr, env, cwd, text):
        self.args, self.returncode = list(args), None
        self.stdin = self.stdout = self.stderr = None
        folder = tempfile.mkdtemp(prefix="forked-")
        try:
            request = {
                "argv": [os.fspath(a) for a in args],
                "env": dict(os.environ if env is None else env),
                "cwd": os.path.abspath(cwd or os.getcwd()),
                "stdin": self._stream("stdin", stdin, folder, text),
                "stdout": self._stream("stdout", stdout, folder, text),
                "stderr": self._stream("stderr", stderr, folder, text),
            }
            self.pid = _server().start(request)
        except BaseException:
            self._close_streams()
            raise
        finally:
            shutil.rmtree(folder)  # the pipes stay open on both ends

    def _stream(self, name, how, folder, text):
        """The path the server opens as the child's `name` stream, and for a PIPE
        this side's end of it (a named pipe opened before the child's end)."""
        if how == STDOUT and name == "stderr":
            return "stdout"
        if how == DEVNULL or (how is None and name == "stdin"):
            return os.devnull
        if how is None:  # inherited: where this process's own stream goes
            return f"/proc/{os.getpid()}/fd/{1 if name == 'stdout' else 2}"
        if how != PIPE:  # a file object or a file descriptor
            return f"/proc/{os.getpid()}/fd/{how if isinstance(how, int) else how.fileno()}"
        path = os.path.join(folder, name)
        os.mkfifo(path)
        # Reading: non-blocking so that the open does not wait for the writer.
        # Writing: read-write, which Linux opens at once, with no reader yet.
        flags = os.O_RDWR if name == "stdin" else os.O_RDONLY | os.O_NONBLOCK
        fd = os.open(path, flags)
        os.set_blocking(fd, True)
        mode = "w" if name == "stdin" else "r"
        end = open(fd, mode + ("" if text else "b"))  # noqa: SIM115  (the pipe's life)
        setattr(self, name, end)
        return path

    def _close_streams(self):
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def poll(self):
        if self.returncode is None:
            self.returncode = _server().returncode(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            code = _server().wait(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout=None):
        """(stdout, stderr) read to their end, once `input` (if any) is written."""
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        readers = {
            name: _Reader(stream)
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
            if stream is not None
        }
        self.wait(timeout)
        out = {name: reader.result() for name, reader in readers.items()}
        return out.get("stdout"), out.get("stderr")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close_streams()
        if self.returncode is None:
            self.wait()


class _Reader(threading.Thread):
    """Reads a pipe to its end beside the others, so that no child blocks writing
    to one pipe while this side waits on another."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.data = stream, None
        self.start()

    def run(self):
        self.data = self.stream.read()

    def result(self):
        self.join()
        self.stream.close()
        return self.data


class _Server:
    """The fork server's process, and what it said about each child."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, _SERVER_SCRIPT], stdin=PIPE, stdout=PIPE
        )
        self.starts, self.exits = queue.Queue(), {}
        self.ended = threading.Condition()
        self.requesting = threading.Lock()
        threading.Thread(target=self._listen, daemon=True).start()
        atexit.register(self.close)

    def close(self):
        """Ends the server (and any child still running) and waits for it, so that
        its CPU time counts in this process's children's, as a subprocess's does."""
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def _listen(self):
        for line in self.process.stdout:
            reply = json.loads(line)
            if "exited" in reply:
                with self.ended:
                    self.exits[reply["exited"]] = reply["returncode"]
                    self.ended.notify_all()
            else:
                self.starts.put(reply)
        self.starts.put({"error": "the fork server has ended"})
        with self.ended:
            self.exits = _Gone(self.exits)
            self.ended.notify_all()

    def start(self, request):
        with self.requesting:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            reply = self.starts.get()
        if "error" in reply:
            raise OSError(f"{request['argv'][1:3]}: {reply['error']}")
        return reply["started"]

    def returncode(self, pid):
        with self.ended:
            return self.exits.get(pid)

    def wait(self, pid, timeout):
        with self.ended:
            self.ended.wait_for(lambda: self.exits.get(pid) is not None, timeout)
            return self.exits.get(pid)


class _Gone(dict):
    """The exits after the server ended: a child it did not report is lost."""

    def get(self, pid, default=None):
        if pid not in self:
            raise RuntimeError(f"the fork server ended before child {pid}")
        return super().get(pid, default)


_state = {"server": None}
_state_lock = threading.Lock()


def _server():
    with _state_lock:
        if _state["server"] is None:
            _state["server"] = _Server()
        return _state["server"]
