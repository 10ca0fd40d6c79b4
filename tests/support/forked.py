"""`popen` and `run`, as subprocess's, for the suite's `python -m MODULE` and
`python SCRIPT` command lines, whose processes start without importing TensorFlow.

Each such process is forked from a server (tests/support/fork_server.py) that has
imported TensorFlow, Keras, tensorflow_datasets and t2t_lite once: a fresh Python
pays 3 to 5 s of CPU for that, some fifty times a run. The child then runs the
command as a fresh Python would: its own working directory, environment, sys.path,
argv, __main__, streams and exit status, signals delivered to its pid, and Python's
own exit. What it shares with its server is what those imports did: the modules
(t2t_lite among them, from where the server found it), the environment variables
TensorFlow reads only at import (TF_CPP_MIN_LOG_LEVEL, T2T_LITE_TF_LOGS: every
child starts as quietly as a t2t_lite CLI), and the string-hash seed. Children
alternate between two servers, so two processes started one after the other (the
workers of a cluster, a run and its rerun) never hash strings alike, as two fresh
Pythons would not.

Tests of TensorFlow's start-up itself use subprocess; so do other command lines, a
child given its own PYTHONHASHSEED, a machine with a GPU (CUDA does not survive a
fork), and everything with T2T_LITE_TEST_FRESH_PROCESSES=1. Pipes are named pipes
the server opens for the child, so a test reads a child's output as it comes.
"""

import atexit
import contextlib
import glob
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
_SERVER_SCRIPT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "fork_server.py"
)
_FRESH = "T2T_LITE_TEST_FRESH_PROCESSES"


def forkable(args, env=None):
    """Whether the servers run `args` (with environment `env`): `python -m MODULE
    ...` or `python SCRIPT.py ...` with this Python, on a machine without a GPU."""
    args = [os.fspath(a) for a in args]
    env = os.environ if env is None else env
    return (
        os.environ.get(_FRESH, "") in ("", "0")
        and "PYTHONHASHSEED" not in env
        and not glob.glob("/dev/nvidia[0-9]*")
        and len(args) >= 2
        and args[0] == sys.executable
        and ((args[1] == "-m" and len(args) >= 3) or args[1].endswith(".py"))
    )


def popen(
    args, *, stdin=None, stdout=None, stderr=None, env=None, cwd=None, text=False
):
    """subprocess.Popen(args, ...) for the arguments the suite uses; forked from a
    server when `forkable(args, env)`."""
    if not forkable(args, env):
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
    """The parts of subprocess.Popen the suite uses, for a child of a server."""

    def __init__(self, args, stdin, stdout, stderr, env, cwd, text):
        self.args, self.returncode, self._text = list(args), None, text
        self.stdin = self.stdout = self.stderr = None
        self._server = _next_server()
        folder = tempfile.mkdtemp(prefix="forked-")
        try:
            request = {
                "argv": [os.fspath(a) for a in args],
                "env": dict(os.environ if env is None else env),
                "cwd": os.path.abspath(cwd or os.getcwd()),
                "stdin": self._stream("stdin", stdin, folder),
                "stdout": self._stream("stdout", stdout, folder),
                "stderr": self._stream("stderr", stderr, folder),
            }
            self.pid, self._generation = self._server.start(request)
            if self.stdin is not None:
                self._reopen_stdin(os.path.join(folder, "stdin"))
        except BaseException:
            self._close_streams()
            raise
        finally:
            shutil.rmtree(folder)  # the pipes stay open on both ends

    def _stream(self, name, how, folder):
        """The path the server opens as the child's `name` stream, and for a PIPE
        this side's end of it (a named pipe opened before the child's end)."""
        if how == STDOUT and name == "stderr":
            return "stdout"
        if how == DEVNULL or (how is None and name == "stdin"):
            return os.devnull
        if how is None:  # inherited: where this process's own stream goes
            how = 1 if name == "stdout" else 2
        if how != PIPE:  # a file object or a file descriptor
            fd = how if isinstance(how, int) else how.fileno()
            return f"/proc/{os.getpid()}/fd/{fd}"
        path = os.path.join(folder, name)
        os.mkfifo(path)
        # Reading: non-blocking so that the open does not wait for the writer.
        # Writing: read-write for now, which Linux opens at once with no reader.
        flags = os.O_RDWR if name == "stdin" else os.O_RDONLY | os.O_NONBLOCK
        self._set_end(name, os.open(path, flags))
        return path

    def _set_end(self, name, fd):
        os.set_blocking(fd, True)
        mode = ("w" if name == "stdin" else "r") + ("" if self._text else "b")
        setattr(self, name, open(fd, mode))  # noqa: SIM115  (lives with the pipe)

    def _reopen_stdin(self, path):
        """The child's stdin, write-only now that the child reads it: a write then
        fails once the child is gone, as with a subprocess's pipe."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: the child has already exited
            fd = None
        self.stdin.close()
        self.stdin = None
        if fd is not None:
            self._set_end("stdin", fd)

    def _close_streams(self):
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def poll(self):
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid, self._generation)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            code = self._server.wait(self.pid, self._generation, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # exited, not yet reaped
                os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout=None):
        """(stdout, stderr) read to their end while `input` (if any) is written,
        as subprocess's: TimeoutExpired if the child or its pipes outlast
        `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pumps = {
            name: _Pump(stream.read)
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
            if stream is not None
        }
        if self.stdin is not None:
            pumps["stdin"] = _Pump(lambda: _write_and_close(self.stdin, input))
        self.wait(timeout)
        out = {}
        for name, pump in pumps.items():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not pump.finished(left):
                raise subprocess.TimeoutExpired(self.args, timeout)
            out[name] = pump.value
        self._close_streams()
        return out.get("stdout"), out.get("stderr")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close_streams()
        if self.returncode is None:
            self.wait()


def _write_and_close(stream, data):
    with contextlib.suppress(BrokenPipeError):
        if data:
            stream.write(data)
        stream.close()


class _Pump(threading.Thread):
    """Reads (or writes) one pipe beside the others, so that no child blocks on
    one pipe while this side waits on another."""

    def __init__(self, work):
        super().__init__(daemon=True)
        self.work, self.value = work, None
        self.start()

    def run(self):
        self.value = self.work()

    def finished(self, timeout):
        self.join(timeout)
        return not self.is_alive()


class _Server:
    """One fork server's process, and what it said about each child."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, _SERVER_SCRIPT], stdin=PIPE, stdout=PIPE
        )
        # exits[pid]: the exit codes of the children that had that pid, in order
        # (pids are reused); a child is the generation-th of its pid.
        self.replies, self.exits, self.starts, self.gone = {}, {}, {}, False
        self.changed = threading.Condition()
        self.sending, self.ids = threading.Lock(), itertools.count()
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
            with self.changed:
                if "exited" in reply:
                    self.exits.setdefault(reply["exited"], []).append(
                        reply["returncode"]
                    )
                else:
                    if "started" in reply:
                        pid = reply["started"]
                        reply["generation"] = self.starts.get(pid, 0)
                        self.starts[pid] = reply["generation"] + 1
                    self.replies[reply["id"]] = reply
                self.changed.notify_all()
        with self.changed:
            self.gone = True
            self.changed.notify_all()

    def start(self, request):
        with self.sending:
            request = {"id": next(self.ids), **request}
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        with self.changed:
            self.changed.wait_for(lambda: request["id"] in self.replies or self.gone)
            reply = self.replies.pop(request["id"], {"error": "the fork server ended"})
        if "error" in reply:
            raise OSError(f"{request['argv'][1:3]}: {reply['error']}")
        return reply["started"], reply["generation"]

    def returncode(self, pid, generation):
        with self.changed:
            return self._exit(pid, generation)

    def wait(self, pid, generation, timeout):
        with self.changed:
            done = lambda: self._exit(pid, generation) is not None  # noqa: E731
            self.changed.wait_for(done, timeout)
            return self._exit(pid, generation)

    def _exit(self, pid, generation):
        codes = self.exits.get(pid, [])
        if len(codes) > generation:
            return codes[generation]
        if self.gone:
            raise RuntimeError(f"the fork server ended before its child {pid}")
        return None


_servers = {"all": [], "turn": itertools.count()}
_servers_lock = threading.Lock()


def _next_server():
    """The servers in turn, each started on first use."""
    with _servers_lock:
        turn = next(_servers["turn"]) % 2
        if len(_servers["all"]) <= turn:
            _servers["all"].append(_Server())
        return _servers["all"][turn]
