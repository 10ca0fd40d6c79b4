"""bench_peers.py's worker processes: one per in-process configuration, so that no
state leaks between configurations (e.g. Keras's global mixed-precision policy).

The parent talks to a worker over a line protocol: the worker builds and warms up,
replies ready, then times one pass over the batches per "run" line on its stdin until
"quit". Replies are JSON lines after MARK on its stdout; its stderr (TF's logs) goes
to a file."""

import json
import os
import subprocess
import sys
import time

from benchkit.peers.corpus import load_batches

MARK = "@@bench_peers "  # prefixes a worker's protocol lines on its stdout


def reply(message):
    print(MARK + json.dumps(message), flush=True)


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


def worker_main(name, spec_path):
    """Child mode: build `name`, warm up (one update: tracing; XLA: one pass, every
    shape compiled), say ready, then time one pass over the batches per "run" line
    on stdin until "quit" (or the end of stdin)."""
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        session_class = session_class_of(name)
        start = time.perf_counter()
        path = spec["xla_batches_path" if name == "t2t_xla" else "batches_path"]
        batches = load_batches(path) or load_batches(spec["batches_path"])
        session = session_class(name, spec, batches)
        session.segment(session.warmup_batches)
        reply(
            {
                "ready": True,
                "warmup_seconds": time.perf_counter() - start,
                "params": session.params,
            }
        )
    except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
        reply({"error": error_line(exc)})
        return
    for line in sys.stdin:
        if line.strip() != "run":
            break
        try:
            reply(session.segment())
        except Exception as exc:  # noqa: BLE001  (this config's error, not a crash)
            reply({"error": error_line(exc)})
            return


# --- parent side ----------------------------------------------------------------------


class Worker:
    """The parent's handle on one worker process (line protocol over its stdin and
    stdout; its stderr, TF's logs included, goes to a file)."""

    def __init__(self, name, script, spec_path, log_path):
        self.name, self.log_path = name, log_path
        with open(log_path, "w") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    script,
                    f"--worker={name}",
                    f"--spec={spec_path}",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def receive(self):
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.proc.wait()
        with open(self.log_path) as f:
            tail = " | ".join(f.read().strip().splitlines()[-3:])
        return {"error": f"worker exited with {self.proc.returncode}: {tail}"[:400]}

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.receive()

    def close(self):
        """Asks the worker to quit and waits for it (no zombie left behind)."""
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):  # it has already exited
            pass
        self.proc.wait(timeout=60)


def start_workers(names, script, spec_path, work_dir, results):
    """Starts a worker per in-process config (`script --worker=NAME`), all at once,
    and waits until each is warmed up (or failed: its status becomes "error")."""
    workers = {
        n: Worker(n, script, spec_path, os.path.join(work_dir, f"worker-{n}.log"))
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
