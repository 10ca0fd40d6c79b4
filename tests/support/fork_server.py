"""The server behind tests/support/forked.py: a Python that imports TensorFlow, Keras,
tensorflow_datasets and t2t_lite once, then forks a child for every command line it
is sent, which runs as `python -m MODULE ARGS` or `python SCRIPT ARGS` would.

A fresh Python spends 3 to 5 s of CPU importing those before its first line of work,
and the suite starts some fifty of them (CLI runs, two-worker clusters, scripts that
need a TensorFlow of their own). A child forked from here starts with them imported.
Nothing here has created a TensorFlow context or a device when it forks, and its
only other thread is OpenBLAS's, which handles a fork itself: each child builds its
own, as a fresh process. (forked.py never uses it on a machine with a GPU, where
CUDA, initialized at the import, would not survive the fork.)

The child leaves the server's loop and runs its command at the top of this script,
so that it ends as a Python program does: an uncaught exception printed by
sys.excepthook, non-daemon threads waited for, atexit, C stdio flushed.

Protocol, one JSON object per line. Requests on stdin: {"id", "argv", "env",
"cwd", "stdin", "stdout", "stderr"}, the streams being paths the server opens for the
child (files in append mode, named pipes, /dev/null) or, for stderr, "stdout".
Replies on stdout: {"id", "started": pid} or {"id", "error": message} for each
request, and {"exited": pid, "returncode": code} when a child ends (code as
subprocess gives it: minus the signal's number for a child killed by one). When
stdin closes, the children still running are killed and the server exits.
"""

import builtins
import json
import os
import select
import signal
import sys
import tempfile
import types


def main():
    python_path = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
    # A fresh Python's sys.path, without this folder and this server's PYTHONPATH
    # (each child puts its own first).
    base_path = [p for p in sys.path[1:] if p not in python_path]
    requests, replies = _protocol_fds()
    # The children run as t2t_lite's CLIs do: TensorFlow imported quietly
    # (t2t_lite/console.py), whatever program a child then runs.
    sys.argv[0] = "t2t-fork-server"
    import tensorflow_datasets  # noqa: F401

    import t2t_lite  # noqa: F401

    child = serve(requests, replies)
    if child is not None:  # in a forked child, the server's loop left behind
        _run_as_main(child, base_path)


def _protocol_fds():
    """The request and reply pipes moved off fds 0 and 1, which then point at
    /dev/null, so that nothing printed in this process can garble a reply."""
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    return requests, replies


def serve(requests, replies):
    """Answers requests until stdin closes (returns None); in a forked child,
    returns its request instead."""
    children, pending = set(), b""
    while True:
        ready, _, _ = select.select([requests], [], [], 0.05)
        if ready:
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = _start(request, (requests, replies))
                if pid == 0:
                    return request
                if isinstance(pid, int):
                    children.add(pid)
                    _send(replies, {"id": request["id"], "started": pid})
                else:
                    _send(replies, {"id": request["id"], "error": pid})
        _reap(children, replies)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    return None


def _send(fd, message):
    os.write(fd, (json.dumps(message) + "\n").encode())  # one write: under PIPE_BUF


def _reap(children, replies):
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        _send(replies, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _start(request, protocol):
    """Forks the child of `request`: its pid here, 0 in the child (its streams
    in place of fds 0 to 2), or an error message. The streams are opened before
    the fork, so that a pipe's other end has its writer once the reply arrives."""
    streams = []
    try:
        streams.append(_open(request["stdin"], os.O_RDONLY))
        for name in ("stdout", "stderr"):
            if request[name] == "stdout":
                streams.append(streams[1])
            else:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
                streams.append(_open(request[name], flags))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except OSError as e:
        pid = f"{type(e).__name__}: {e}"
    if pid == 0:
        try:
            for target, fd in enumerate(streams):
                os.dup2(fd, target)
            for fd in {*streams, *protocol}:
                os.close(fd)
        except OSError:
            os._exit(70)  # EX_SOFTWARE: no stdio of its own to say why
        return 0
    for fd in set(streams):
        os.close(fd)
    return pid


def _open(path, flags):
    # Non-blocking, so that opening a named pipe never waits for its other end;
    # the child gets it blocking, as an ordinary pipe.
    fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
    os.set_blocking(fd, True)
    return fd


def _run_as_main(request, base_path):
    """Runs the request's command line in this forked process as a fresh Python
    would: its folder or the working directory first on sys.path, then PYTHONPATH,
    in a new __main__ module."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this environment's TMPDIR
    argv = request["argv"]
    module = argv[1] == "-m"
    target = argv[2] if module else argv[1]
    first = os.getcwd() if module else os.path.dirname(os.path.abspath(target))
    python_path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    sys.path[:] = [first, *filter(None, python_path), *base_path]
    sys.argv = [target, *argv[3 if module else 2 :]]
    sys.orig_argv = list(argv)
    import numpy as np

    np.random.seed()  # numpy's global generator: this process's own entropy
    main_module = types.ModuleType("__main__")
    main_module.__builtins__ = builtins
    sys.modules["__main__"] = main_module
    if module:
        import runpy

        # What `python -m` itself calls: the module's code in __main__.
        runpy._run_module_as_main(target)
    else:
        main_module.__file__, main_module.__cached__ = target, None
        with open(target, "rb") as f:
            code = compile(f.read(), target, "exec")
        exec(code, main_module.__dict__)


if __name__ == "__main__":
    main()
