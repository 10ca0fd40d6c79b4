"""The sizes and rates of a Transformer, one frozen dataclass every layer takes."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Every size and rate of a Transformer (Flax's examples do the same).

    `Transformer.from_hparams` builds it; layers take it whole and read what they need.
    """

    vocab_size: int
    hidden_size: int
    filter_size: int
    num_encoder_layers: int
    num_decoder_layers: int
    num_heads: int
    layer_prepostprocess_dropout: float
    attention_dropout: float
    relu_dropout: float
    shared_embedding_and_softmax_weights: bool
    norm_epsilon: float = 1e-6
    initializer_gain: float = 1.0
    # The compute dtype: float32, bfloat16 or float16. Variables stay float32 (Keras's
    # "mixed_*" policies); logits are returned as float32.
    activation_dtype: str = "float32"
    # Recompute each encoder/decoder layer's activations in the backward pass instead
    # of keeping them (models/recompute.py): less memory, one more forward pass.
    recompute_grad: bool = False

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.activation_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                "activation_dtype must be float32, bfloat16 or float16, got "
                f"{self.activation_dtype!r}"
            )

    @property
    def dtype_policy(self):
        """The Keras dtype policy every layer is built with: float32 variables, and
        computations in activation_dtype."""
        if self.activation_dtype == "float32":
            return "float32"
        return f"mixed_{self.activation_dtype}"


def as_config(config):
    """A TransformerConfig, or the dict `get_config` made of one -> TransformerConfig."""
    if isinstance(config, TransformerConfig):
        return config
    return TransformerConfig(**config)
