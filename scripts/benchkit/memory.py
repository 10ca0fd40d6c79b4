"""Memory as a process sees it, for bench_memory.py's children: RSS and its
high-water mark from /proc/self, and TensorFlow's CPU allocator (which keeps
statistics only in a BFC allocator, or oneDNN's: None where it keeps none)."""

import tensorflow as tf

MIB = 2**20


def status_mib(field):
    """A /proc/self/status field (VmRSS, VmHWM, ...) in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_rss_peak():
    """Resets VmHWM (and ru_maxrss) to the current RSS; False if not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def tf_memory():
    """The TF CPU allocator's {"current", "peak"} in MiB, or None if unsupported."""
    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, RuntimeError):
        return None
    return {k: info[k] / MIB for k in ("current", "peak")}


def reset_tf_peak():
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except (ValueError, RuntimeError):
        pass


def variable_mib(variables):
    return (
        sum(
            int(tf.TensorShape(v.shape).num_elements()) * tf.as_dtype(v.dtype).size
            for v in variables
        )
        / MIB
    )
