"""Memory as a benchmark child sees it: RSS and its high-water mark from /proc/self,
TensorFlow's CPU allocator, the bytes of variables, and which allocator a child's
TensorFlow logged creating. bench_memory.py and bench_fit.py (and their children)
share it.

TF keeps CPU allocator statistics only in a BFC allocator (or oneDNN's), so a child
that needs them runs with CHILD_ENV (TF_CPU_ALLOCATOR_USE_BFC=true, and the log lines
that name the allocator). TensorFlow is imported inside the functions: a parent
process that only reads its children's logs never loads it."""

import re

MIB = 2**20
GB = 10**9
CHILD_ENV = {
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "bfc_allocator=1",
}
ALLOCATORS = {
    "bfc_cpu_allocator_for_gpu": "TF's BFC CPU allocator (TF_CPU_ALLOCATOR_USE_BFC)",
    "mklcpu": "oneDNN's mklcpu allocator",
}


# --- the process ------------------------------------------------------------------


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


# --- TensorFlow's CPU allocator -----------------------------------------------------


def allocator():
    """(in-use bytes, peak bytes) of TF's CPU allocator; raises where it keeps none."""
    import tensorflow as tf

    info = tf.config.experimental.get_memory_info("CPU:0")
    return info["current"], info["peak"]


def tf_memory():
    """The TF CPU allocator's {"current", "peak"} in MiB, or None if unsupported."""
    try:
        current, peak = allocator()
    except (ValueError, RuntimeError):
        return None
    return {"current": current / MIB, "peak": peak / MIB}


def reset_peak():
    """Resets the TF CPU allocator's peak; a no-op where it keeps no statistics."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except (ValueError, RuntimeError):
        pass


def logged_allocator(stderr):
    """(allocator name, oneDNN on) from a child's TensorFlow log."""
    names = re.findall(r"Creating new BFCAllocator named: (\S+)", stderr)
    onednn = "oneDNN custom operations are on" in stderr
    return (names[0] if names else None), onednn


# --- variables ------------------------------------------------------------------------


def variable_bytes(variables):
    import tensorflow as tf

    return sum(
        int(tf.TensorShape(v.shape).num_elements()) * tf.as_dtype(v.dtype).size
        for v in variables
    )


def variable_mib(variables):
    return variable_bytes(variables) / MIB


def optimizer_parts(optimizer):
    """(Adam slot variables, accumulator variables, other variables) of a Keras
    optimizer, by variable path."""
    slots, accumulators, other = [], [], []
    for v in optimizer.variables:
        path = v.path
        if path.endswith(("_momentum", "_velocity")):
            slots.append(v)
        elif "gradient_accumulator" in path:
            accumulators.append(v)
        else:
            other.append(v)
    return slots, accumulators, other


def mib(x):
    """MiB with as many decimals as a small model needs."""
    x /= MIB
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
