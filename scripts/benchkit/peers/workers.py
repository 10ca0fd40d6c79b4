"""bench_peers.py's worker processes: one per in-process configuration, so that no
state leaks between configurations (e.g. Keras's global mixed-precision policy).

Workers are forked by a multiprocessing forkserver that has imported TensorFlow and
Keras once, and run nothing: each worker is still a process no other configuration
has touched, without paying that import (about 4 s of CPU) again. On a machine with
an NVIDIA GPU they are spawned instead (CUDA does not survive a fork). The parent
talks to a worker over a pipe: the worker builds and warms up, replies ready, then
times one pass over the batches per "run" message until "quit". Its stdout and
stderr (TensorFlow's logs included) go to a file."""

import glob
import json
import multiprocessing
import os
import sys
import time

from benchkit.peers.corpus import load_batches

# What the forkserver imports before it forks any worker: only the dependencies
# every configuration shares. t2t_lite, keras-hub and benchkit come with each
# worker's own start, from the parent's sys.path (the forkserver's is not it), so a
# worker runs the checkout the parent runs, and a failing import fails one config.
PRELOAD = ["tensorflow", "keras"]


def error_line(exc):
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {lines[0]}"[:300]


def session_class_of(name):
    """KerasSession or T2TSession, imported here: only a worker needs either."""
    if name.startswith("keras"):
        from benchkit.peers.keras_peer import KerasSession

        return KerasSession
    from benchkit.peers.t2t_session import T2TSession

    return T2TSession


def worker_main(name, spec_path, log_path, conn):
    """A worker: build `name`, warm up (one update: tracing; XLA: one pass, every
    shape compiled), say ready on `conn`, then time one pass over the batches per
    "run" message until "quit" (or the parent's end of the pipe closes)."""
    _output_to(log_path)
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        session_class = session_class_of(name)
        start = time.perf_counter()
        path = spec["xla_batches_path" if name == "t2t_xla" else "batches_path"]
        batches = load_batches(path) or load_batches(spec["batches_path"])
        session = session_class(name, spec, batches)
        session.segment(session.warmup_batches)
        conn.send(
            {
                "ready": True,
                "warmup_seconds": time.perf_counter() - start,
                "params": session.params,
            }
        )
    except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
        conn.send({"error": error_line(exc)})
        return
    while _next_command(conn) == "run":
        try:
            conn.send(session.segment())
        except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
            conn.send({"error": error_line(exc)})
            return


def _next_command(conn):
    try:
        return conn.recv()
    except EOFError:  # the parent has gone
        return "quit"


def _output_to(path):
    """This process's stdout and stderr, TensorFlow's C++ logs included, to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# --- parent side ----------------------------------------------------------------------


def worker_context():
    """The multiprocessing context that starts workers: a forkserver that preloads
    PRELOAD, or plain spawn on a machine with an NVIDIA GPU."""
    if glob.glob("/dev/nvidia[0-9]*"):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


class Worker:
    """The parent's handle on one worker process (messages over a pipe; the
    worker's output goes to a file)."""

    def __init__(self, name, context, spec_path, log_path):
        self.name, self.log_path = name, log_path
        open(log_path, "w").close()  # no earlier run's log read as this one's
        self.conn, child_end = context.Pipe()
        self.proc = context.Process(
            target=worker_main,
            args=(name, spec_path, log_path, child_end),
            name=f"bench_peers-{name}",
            daemon=True,  # a parent that fails does not wait for its workers
        )
        self.proc.start()
        child_end.close()  # the worker holds its own: its exit closes the pipe

    def receive(self):
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # it has exited
            self.proc.join()
        with open(self.log_path) as f:
            tail = " | ".join(f.read().strip().splitlines()[-3:])
        return {"error": f"worker exited with {self.proc.exitcode}: {tail}"[:400]}

    def ask(self, command):
        try:
            self.conn.send(command)
        except (BrokenPipeError, OSError):  # it has exited: receive says how
            pass
        return self.receive()

    def close(self):
        """Asks the worker to quit and waits for it (killed after a minute)."""
        try:
            self.conn.send("quit")
        except (BrokenPipeError, OSError):  # it has already exited
            pass
        self.conn.close()
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def start_workers(names, spec_path, work_dir, results):
    """Starts a worker per in-process config, all at once, and waits until each is
    warmed up (or failed: its status becomes "error")."""
    context = worker_context()
    workers = {
        n: Worker(n, context, spec_path, os.path.join(work_dir, f"worker-{n}.log"))
        for n in names
    }
    for name, worker in workers.items():
        message = worker.receive()
        if "error" in message:
            results[name].fail(message["error"])
            worker.close()
        else:
            results[name].params = message["params"]
            results[name].warmup_seconds = message["warmup_seconds"]
        print(f"{name}: {message}", flush=True)
    return {n: w for n, w in workers.items() if results[n].status == "measured"}
