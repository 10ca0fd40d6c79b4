"""Memory as TensorFlow's CPU allocator counts it, for bench_fit.py (and its
children): the allocator's in-use and peak bytes, the bytes of variables, and which
allocator a child's TensorFlow logged creating.

TF keeps CPU allocator statistics only in a BFC allocator, so every child runs with
CHILD_ENV (TF_CPU_ALLOCATOR_USE_BFC=true, and the log lines that name it)."""

import re

MIB = 2**20
GB = 10**9
# TF keeps CPU allocator statistics only in a BFC allocator; the log says which.
CHILD_ENV = {
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "bfc_allocator=1",
}
ALLOCATORS = {
    "bfc_cpu_allocator_for_gpu": "TF's BFC CPU allocator (TF_CPU_ALLOCATOR_USE_BFC)",
    "mklcpu": "oneDNN's mklcpu allocator",
}


def allocator():
    """(in-use bytes, peak bytes) of TF's CPU allocator."""
    import tensorflow as tf

    info = tf.config.experimental.get_memory_info("CPU:0")
    return info["current"], info["peak"]


def reset_peak():
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats("CPU:0")


def variable_bytes(variables):
    import tensorflow as tf

    return sum(
        int(tf.TensorShape(v.shape).num_elements()) * tf.as_dtype(v.dtype).size
        for v in variables
    )


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


def logged_allocator(stderr):
    """(allocator name, oneDNN on) from a child's TensorFlow log."""
    names = re.findall(r"Creating new BFCAllocator named: (\S+)", stderr)
    onednn = "oneDNN custom operations are on" in stderr
    return (names[0] if names else None), onednn


def mib(x):
    """MiB with as many decimals as a small model needs."""
    x /= MIB
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
