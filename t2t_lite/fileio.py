"""Writing files so that a crash never leaves half of one, on any tf.io.gfile path.

Every file t2t_lite writes whole (hparams.json, run.json, vocabularies, manifests,
decodes, TFRecord shards) goes through a temporary name in the same directory and a
rename, so a reader sees the old file or the new one, never a torn one. The
temporary name carries the process id, so two writers never share one.
`tf.io.gfile` makes the same code work on a shared or `gs://` output directory.
"""

import os

import tensorflow as tf


def temp_name(path):
    """The name `path` has while it is being written (never read as data)."""
    return f"{path}.tmp-{os.getpid()}"


def fsync(path):
    """Flushes a finished local file to disk (a no-op for remote file systems)."""
    if "://" in path:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(source, target):
    """Renames `source` to `target`, replacing it (atomic on local file systems)."""
    tf.io.gfile.rename(source, target, overwrite=True)


def write_atomically(path, content):
    """Writes `content` (str or bytes) to `path` via a temporary file and a rename."""
    tmp = temp_name(path)
    mode = "wb" if isinstance(content, bytes) else "w"
    try:
        with tf.io.gfile.GFile(tmp, mode) as f:
            f.write(content)
        fsync(tmp)
        replace(tmp, path)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise


def append_line(path, line):
    """Appends one line of text to `path` (created if missing)."""
    if "://" in path:  # object stores cannot append: rewrite the whole file
        old = tf.io.gfile.GFile(path).read() if tf.io.gfile.exists(path) else ""
        write_atomically(path, old + line + "\n")
        return
    with open(path, "a") as f:
        f.write(line + "\n")
