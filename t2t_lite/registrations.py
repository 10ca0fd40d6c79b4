"""Registers the built-in models and problems (hparams sets and optimizers register
themselves in hparams_sets.py and optim/optimizers.py)."""

from t2t_lite.data import problems
from t2t_lite.models.transformer import Transformer
from t2t_lite.registry import MODELS, PROBLEMS

MODELS.add("transformer", Transformer)

for _problem in (
    problems.AlgorithmicReverse,
    problems.AlgorithmicIdentity,
    problems.AlgorithmicAdditionDecimal,
):
    PROBLEMS.add(_problem.name, _problem)
