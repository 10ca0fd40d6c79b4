from t2t_lite.models.transformer import Transformer, token_loss, token_accuracy
