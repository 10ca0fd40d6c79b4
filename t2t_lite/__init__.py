"""t2t_lite: Tensor2Tensor-style Transformer training with exact gradient accumulation.

Importing the package imports every module that registers something, so every
registered name exists as soon as `import t2t_lite` returns.
"""

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

__version__ = "0.1.0"
