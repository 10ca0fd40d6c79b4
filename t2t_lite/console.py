"""A quiet console for the CLIs: TensorFlow's start-up and per-save noise hidden.

What t2t-trainer printed before its first line of its own, on a CPU machine:
absl's "All log messages before absl::InitializeLog() ..." notice, the oneDNN
notice, "Could not find cuda drivers", cpu_feature_guard's "This TensorFlow binary
is optimized ..." (two lines), "failed call to cuInit", some of them twice; and at
every checkpoint save, "Sharding callback duration: N microseconds".

The C++ lines come from two sources. cpu_feature_guard and cuInit obey
TF_CPP_MIN_LOG_LEVEL, which must be set before TensorFlow is imported: `quiet()` runs
from t2t_lite/__init__.py, which every console script imports first, and sets it to
1 (hide C++ INFO; warnings and errors stay) unless the user set it. The oneDNN,
cuda-driver and absl-notice lines are written before absl's logging is initialized
and obey nothing: while TensorFlow is imported and its devices listed, file
descriptor 2 goes to a temporary file, and what it received is written back to
stderr without those known lines (anything else, e.g. a warning, passes through).
"Sharding callback" is an absl INFO line of TensorFlow's Python checkpoint code; a
logging filter drops just that line.

Only the t2t_lite CLIs (a `t2t-*` console script or `python -m t2t_lite.bin.*`) are
made quiet; a program importing t2t_lite as a library keeps TensorFlow's defaults.
T2T_LITE_TF_LOGS=1 shows everything again.
"""

import logging
import os
import re
import sys
import tempfile

ENV_SHOW = "T2T_LITE_TF_LOGS"

# Lines TensorFlow prints at start-up that tell a CPU user nothing they can act on.
_STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called"
    r"|port\.cc:\d+\] oneDNN custom operations are on"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
    r"|^To enable the following instructions: .* rebuild TensorFlow"
)
_SAVE_NOISE = "Sharding callback duration"


def showing_tf_logs():
    return os.environ.get(ENV_SHOW, "").strip() not in ("", "0")


def _is_cli():
    """Whether this process is one of t2t_lite's CLIs."""
    if os.path.basename(sys.argv[0] if sys.argv else "").startswith("t2t-"):
        return True
    argv = list(getattr(sys, "orig_argv", []))
    return any(
        a == "-m" and argv[i + 1].startswith("t2t_lite.bin.")
        for i, a in enumerate(argv[:-1])
    )


def quiet():
    """Hides TensorFlow's start-up and per-save noise in a CLI process (see the
    module docstring); does nothing elsewhere, with T2T_LITE_TF_LOGS=1, or once
    TensorFlow is already imported."""
    if showing_tf_logs() or not _is_cli() or "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    with _filtered_stderr(_STARTUP_NOISE):
        import tensorflow as tf

        tf.config.list_physical_devices("GPU")  # cuInit, without creating devices
    from absl import logging as absl_logging

    absl_logging.get_absl_logger().addFilter(_DropSaveNoise())


class _DropSaveNoise(logging.Filter):
    def filter(self, record):
        return not str(record.msg).startswith(_SAVE_NOISE)


class _filtered_stderr:
    """File descriptor 2 into a temporary file; on exit, its lines that do not
    match `noise` are written to the real stderr."""

    def __init__(self, noise):
        self.noise = noise

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = tempfile.TemporaryFile(mode="w+b")
        os.dup2(self.file.fileno(), 2)

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        text = self.file.read().decode("utf-8", "replace")
        self.file.close()
        kept = [line for line in text.splitlines() if not self.noise.search(line)]
        if kept:
            sys.stderr.write("\n".join(kept) + "\n")
            sys.stderr.flush()
        return False
