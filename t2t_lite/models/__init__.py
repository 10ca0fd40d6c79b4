"""Models. Registration happens in t2t_lite/registrations.py."""

from t2t_lite.models.losses import token_accuracy, token_loss
from t2t_lite.models.transformer import Transformer

__all__ = ["Transformer", "token_accuracy", "token_loss"]
