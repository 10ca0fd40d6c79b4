"""The server behind tests/support/forked.py: a Python that imports TensorFlow, Keras,
tensorflow_datasets and t2t_lite once, then forks a child for every command line it
is sent, which runs as `python -m MODULE ARGS` or `python SCRIPT ARGS` would.

A fresh Python spends 3 to 5 s of CPU importing those before its first line of work,
and the suite starts some fifty of them (CLI runs, two-worker clusters, scripts that
need a TensorFlow of their own). A child forked from here starts with them imported.
Nothing here has created a TensorFlow context, a thread or a device when it forks,
which is what makes the fork safe: each child builds its own, as a fresh process.

Protocol, one JSON object per line. Requests on stdin: {"argv", "env", "cwd",
"stdin", "stdout", "stderr"}, the streams being paths the server opens for the child
(files in append mode, named pipes, /dev/null) or, for stderr, "stdout". Replies on
stdout: {"started": pid} or {"error": message} for each request, in order, and
{"exited": pid, "returncode": code} when a child ends (code as subprocess gives it:
minus the signal's number for a child killed by one). When stdin closes, the
children still running are killed and the server exits.
"""

import atexit
import json
import os
import runpy
import select
import signal
import sys
import threading
import traceback


def main():
    base_path = sys.path[1:]  # a fresh Python's sys.path, without this folder
    requests, replies = _protocol_fds()
    # The children run as t2t_lite's CLIs do: TensorFlow imported quietly
    # (t2t_lite/console.py), whatever program a child then runs.
    sys.argv[0] = "t2t-fork-server"
    import tensorflow_datasets  # noqa: F401

    import t2t_lite  # noqa: F401

    serve(requests, replies, base_path)


def _protocol_fds():
    """The request and reply pipes moved off fds 0 and 1, which then point at
    /dev/null, so that nothing printed in this process can garble a reply."""
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    return requests, replies


def serve(requests, replies, base_path):
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
                reply = _start(json.loads(line), base_path, (requests, replies))
                children.add(reply.get("started"))
                _send(replies, reply)
        _reap(children, replies)
    for pid in children - {None}:
        os.kill(pid, signal.SIGKILL)


def _send(fd, message):
    os.write(fd, (json.dumps(message) + "\n").encode())  # one write: under PIPE_BUF


def _reap(children, replies):
    while children - {None}:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        _send(replies, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _start(request, base_path, protocol):
    """Forks the child of `request`; its streams are opened here, before the fork,
    so that a pipe's other end sees its writer as soon as the reply arrives."""
    try:
        streams = [
            _open(request["stdin"], os.O_RDONLY),
            _open(request["stdout"], os.O_WRONLY | os.O_APPEND | os.O_CREAT),
        ]
        if request["stderr"] == "stdout":
            streams.append(streams[1])
        else:
            streams.append(
                _open(request["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            )
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    pid = os.fork()
    if pid == 0:
        code = 70  # EX_SOFTWARE, should the child's set-up itself fail
        try:
            for target, fd in enumerate(streams):
                os.dup2(fd, target)
            for fd in {*streams, *protocol}:
                os.close(fd)
            code = _run_as_main(request, base_path)
        finally:
            os._exit(code)
    for fd in set(streams):
        os.close(fd)
    return {"started": pid}


def _run_as_main(request, base_path):
    """Runs the request's command line in this forked process as a fresh Python
    would (its folder or the working directory first on sys.path, then PYTHONPATH),
    through to what Python does at exit; returns the exit code."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
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
    code = 0
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001  (Python prints any uncaught one and exits 1)
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():  # Python waits for them at exit
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


def _exit_code(code):
    """sys.exit's argument as the process's exit status, as Python makes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _open(path, flags):
    # Non-blocking, so that opening a named pipe never waits for its other end;
    # the child gets it blocking, as an ordinary pipe.
    fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
    os.set_blocking(fd, True)
    return fd


if __name__ == "__main__":
    main()
