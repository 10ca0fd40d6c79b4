"""The OpenNMT-tf peer (bench_peers.py, bench_fit.py, opennmt_recipe.py): its virtual
environment, the model file, the YAML writer, the reading of `onmt-main`'s log, a run
that follows that log line by line and is stopped when its reader says so, and
bench_peers' timed run (`run_opennmt`).

OpenNMT-tf 2.32 needs TensorFlow 2.12, so it lives in a virtual environment of its
own (`setup_opennmt`) and is only ever run as a subprocess (`onmt-main`, or a script
under the venv's python). Plain Python: importing this costs nothing.
"""

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time

OPENNMT_PACKAGES = ("opennmt-tf==2.32.0", "tensorflow-cpu==2.12.1")
DEFAULT_VENV = os.path.join(
    os.path.expanduser("~"), ".cache", "t2t_lite", "opennmt-venv"
)

# A Transformer of the given sizes, shared embeddings and softmax (as t2t_lite's).
OPENNMT_MODEL = """import opennmt

def model():
    return opennmt.models.Transformer(
        num_layers={num_layers}, num_units={hidden_size}, num_heads={num_heads},
        ffn_inner_dim={filter_size}, dropout={dropout}, attention_dropout={dropout},
        ffn_dropout={dropout},
        share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL)
"""

# onmt-main's per-update line: "<time>: I ... Step = k ; ... tokens/s = N (S source,
# T target) ; Learning rate = ... ; Loss = ...". T is target tokens per second since
# the statistics were last reset (after the previous log line or checkpoint).
STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\d*: I "
STEP_LINE = re.compile(STAMP + r".*Step = (\d+) ;.*tokens/s = \d+ \(.*?(\d+) target\)")
SAVED_LINE = re.compile(STAMP + r".*Saved checkpoint (\S+)")
RATE = re.compile(r"Learning rate = ([-+.e\d]+)")


def opennmt_main(venv):
    return os.path.join(venv, "bin", "onmt-main")


def opennmt_env():
    """The environment of an OpenNMT subprocess: ours without PYTHONPATH (which would
    put this repository's TensorFlow 2.21 packages in front of the venv's 2.12)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "1"}


def setup_opennmt(venv):
    """Creates `venv` with OpenNMT-tf 2.32 and TensorFlow 2.12 (needs the network)."""
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run(
        [
            os.path.join(venv, "bin", "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            *OPENNMT_PACKAGES,
        ],
        check=True,
    )
    print(f"OpenNMT-tf ready in {venv}: {' '.join(OPENNMT_PACKAGES)}")


def yaml_text(config):
    """`config` as YAML: JSON is YAML, except that YAML 1.1 (PyYAML) reads 1e-09 as a
    string, so exponents get a mantissa with a dot (1.0e-09)."""
    return re.sub(
        r"(?<=: )(\d+)e([-+]?\d+)(?=,?\n)", r"\1.0e\2", json.dumps(config, indent=1)
    )


def log_time(stamp):
    """A log line's timestamp ("2026-11-30 23:25:30.378") as a datetime."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")


def run_facts(text):
    """From onmt-main's training log: micro-batches per update, the batch size
    (tokens, padding included) and the number of parameters (None if not logged)."""
    accumulate = re.search(r"Accumulate gradients of (\d+) iterations", text)
    batch = re.search(r"^train:\n(?:  .*\n)*?  batch_size: (\d+)$", text, re.MULTILINE)
    params = re.search(r"Number of model parameters: (\d+)", text)
    return {
        "accumulate": int(accumulate[1]) if accumulate else 1,
        "batch_size": int(batch[1]) if batch else None,
        "params": int(params[1]) if params else None,
    }


def follow(command, log_path, read_line):
    """Runs `command` (an OpenNMT program) with its output in `log_path`, handing
    each complete line, as it comes (read every half second), to `read_line(line,
    cpu)` (cpu: the process's CPU seconds so far), until that returns True or the
    process ends; then stops it. (Exit status, the log's text)."""
    pending, cpu = "", 0.0
    with open(log_path, "w") as log, open(log_path) as reader:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=opennmt_env())
        try:
            done = False
            while not done and process.poll() is None:
                time.sleep(0.5)
                *lines, pending = (pending + reader.read()).split("\n")
                cpu = cpu_seconds(process.pid) if process.poll() is None else cpu
                for line in lines:  # every line, also after the one that says done
                    done = read_line(line, cpu) or done
        finally:
            code = stop(process)
    with open(log_path) as f:
        return code, f.read()


def stop(process):
    """SIGINT (Ctrl-C: onmt-main ends within seconds), then SIGTERM, then SIGKILL;
    the exit status."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(wait)
            except subprocess.TimeoutExpired:
                pass
    return process.wait()


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid`, all its threads, so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- bench_peers: one timed onmt-main run ------------------------------------------


def opennmt_config(spec, paths, model_dir, max_step):
    """onmt-main's YAML config (written as JSON, which YAML reads)."""
    return {
        "model_dir": model_dir,
        "data": {
            "train_features_file": paths["src"],
            "train_labels_file": paths["tgt"],
            "source_vocabulary": paths["vocab"],
            "target_vocabulary": paths["vocab"],
        },
        "params": {
            "optimizer": "Adam",
            "optimizer_params": {"beta_1": 0.9, "beta_2": 0.997, "epsilon": 1e-9},
            "learning_rate": 2.0,
            "decay_type": "NoamDecay",
            "decay_params": {"model_dim": spec["hidden_size"], "warmup_steps": 8000},
            "label_smoothing": spec["label_smoothing"],
            "average_loss_in_time": True,
        },
        "train": {
            "batch_type": "tokens",
            "batch_size": spec["batch_size"],
            "effective_batch_size": spec["batch_size"] * spec["accumulate_steps"],
            "length_bucket_width": 1,
            "maximum_features_length": spec["max_tokens"],
            "maximum_labels_length": spec["max_tokens"],
            "max_step": max_step,
            "save_summary_steps": 1,
            "save_checkpoints_steps": 10**7,
            "keep_checkpoint_max": 1,
        },
    }


def parse_opennmt_log(text, warmup):
    """{"tokens", "seconds", "params"} of the updates after `warmup`, from onmt-main's
    per-update lines ("Step = k ; ... tokens/s = ... (S source, T target)"): T is the
    target tokens/s of update k alone, so update k trained T x (time of line k - time
    of line k-1) target tokens."""
    times, rates = {}, {}
    for line in text.splitlines():
        match = STEP_LINE.search(line)
        if match:
            stamp = log_time(match[1])
            times[int(match[2])], rates[int(match[2])] = stamp, int(match[3])
    timed = [k for k in sorted(times) if k > warmup and k - 1 in times]
    if not timed:
        raise RuntimeError("no per-update 'Step = ...' lines after warmup in its log")
    seconds = [(times[k] - times[k - 1]).total_seconds() for k in timed]
    params = re.search(r"Number of model parameters: (\d+)", text)
    return {
        "tokens": sum(rates[k] * s for k, s in zip(timed, seconds)),
        "seconds": sum(seconds),
        "updates": len(timed),
        "params": int(params[1]) if params else None,
    }


def run_opennmt(spec, paths, run_dir, venv, warmup, updates):
    """One fresh `onmt-main train` of `warmup` + `updates` updates in `run_dir`; its
    timed part (parse_opennmt_log)."""
    os.makedirs(run_dir, exist_ok=True)
    model_path = os.path.join(run_dir, "transformer_model.py")
    with open(model_path, "w") as f:
        f.write(OPENNMT_MODEL.format(**spec))
    config_path = os.path.join(run_dir, "config.yml")
    max_step = warmup + updates
    config = opennmt_config(spec, paths, os.path.join(run_dir, "model"), max_step)
    with open(config_path, "w") as f:
        f.write(yaml_text(config))
    result = subprocess.run(
        [
            opennmt_main(venv),
            "--model",
            model_path,
            "--config",
            config_path,
            "--seed",
            str(spec["seed"]),
            "train",
        ],
        capture_output=True,
        text=True,
        env=opennmt_env(),
        check=False,
    )
    with open(os.path.join(run_dir, "onmt-main.log"), "w") as f:
        f.write(result.stderr)
    if result.returncode:
        tail = " | ".join(result.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"onmt-main exited with {result.returncode}: {tail}"[:400])
    return parse_opennmt_log(result.stderr, warmup)
