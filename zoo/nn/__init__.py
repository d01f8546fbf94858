"""Building blocks on the attention core (pure PyTorch): the Transformer block, MLP, drop path, the
activation table, and the config base every model's config extends."""

from zoo.nn.activations import ACTIVATIONS, get_activation
from zoo.nn.blocks import MLP, DropPath, TransformerBlock, transformer_stack
from zoo.nn.config import ModelConfig

__all__ = ["ACTIVATIONS", "MLP", "DropPath", "ModelConfig", "TransformerBlock", "get_activation", "transformer_stack"]
