"""Models. Registration happens in t2t_lite/registrations.py."""

from t2t_lite.models.transformer import Transformer, token_accuracy, token_loss

__all__ = ["Transformer", "token_accuracy", "token_loss"]
