"""Registers the built-in models and problems (hparams sets and optimizers register
themselves in hparams_sets.py and optim/optimizers.py)."""

from t2t_lite.data import numbers_problem, problems, text_problems, tfds_problems
from t2t_lite.models.transformer import Transformer
from t2t_lite.registry import MODELS, PROBLEMS

MODELS.add("transformer", Transformer)

for _problem in (
    problems.AlgorithmicReverse,
    problems.AlgorithmicIdentity,
    problems.AlgorithmicAdditionDecimal,
    # Text problems: t2t-datagen writes their vocabulary and TFRecords to --data_dir.
    text_problems.TranslateParallelText,
    numbers_problem.TranslateNumbersEnFr,
    *tfds_problems.PROBLEM_CLASSES,
):
    PROBLEMS.add(_problem.name, _problem)
