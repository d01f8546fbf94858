"""Building blocks on the attention core (pure PyTorch): the Transformer block and its config, MLP, drop path,
dropout with a fast CPU mask, the encoder trunk (blocks, final norm, pooling, head) the encoders share, the
activation table, and the config base every model's config extends."""

from zoo.nn.activations import ACTIVATIONS, get_activation
from zoo.nn.blocks import MLP, BlockConfig, DropPath, TransformerBlock, transformer_stack
from zoo.nn.config import ModelConfig
from zoo.nn.dropout import Dropout
from zoo.nn.encoder import POOLINGS, EncoderTrunk, pool_tokens

__all__ = [
    "ACTIVATIONS",
    "BlockConfig",
    "MLP",
    "POOLINGS",
    "DropPath",
    "Dropout",
    "EncoderTrunk",
    "ModelConfig",
    "TransformerBlock",
    "get_activation",
    "pool_tokens",
    "transformer_stack",
]
