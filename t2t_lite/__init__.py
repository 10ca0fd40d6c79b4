"""t2t_lite: Tensor2Tensor-style Transformer training with exact gradient accumulation.

Importing the package imports every module that registers something, so every
registered name exists as soon as `import t2t_lite` returns.
"""

import gc

# Importing TensorFlow and Keras creates some 400,000 objects that live as long as the
# process, and the garbage collector would walk them over and over: 6 full collections
# while they are created, and every full collection after, while a trace builds a
# graph. So the import runs with the collector paused (0.9× its CPU time), and what
# exists once it is done is frozen (gc.freeze): never walked again, which halves the
# collector's time in a process that traces (docs/benchmarks.md, "Start-up"). The
# price: a reference cycle that exists before t2t_lite is first imported is never
# freed (plain references still are). The collector then runs as it was before.
_collecting = gc.isenabled()
gc.disable()
try:
    from t2t_lite import console

    console.quiet()  # before TensorFlow's first import: see t2t_lite/console.py

    from t2t_lite import (
        hparams_sets,  # noqa: F401  (registers hparams sets)
        registrations,  # noqa: F401  (registers models and problems)
    )
    from t2t_lite.optim import (
        adaptive_batch,  # noqa: F401  (registers the adaptive batch plan)
        batch_schedule,  # noqa: F401  (registers the linear and steps batch plans)
        optimizers,  # noqa: F401  (registers optimizers)
        time_optimal_batch,  # noqa: F401  (registers the time-optimal batch plan)
    )
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

__version__ = "0.1.0"
