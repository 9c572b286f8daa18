"""transformer_lab: the Transformer of "Attention Is All You Need", built one idea at a time.

The names below are in the order the course teaches them; each module's docstring says which
chapter builds it.
"""

from transformer_lab import _torch_range  # noqa: F401 - first: one clear sentence where the PyTorch is too old

from transformer_lab.attention import scaled_dot_product_attention  # chapter 01
from transformer_lab.masking import (  # chapter 02
    causal_mask,
    from_additive_mask,
    invert_mask,
    padding_mask,
    target_mask,
    to_additive_mask,
)
from transformer_lab.multihead import MultiHeadAttention, record_attention  # chapter 03
from transformer_lab.normalization import (  # chapter 04
    BatchNorm,
    LayerNorm,
    batch_norm_statistics,
    layer_norm_statistics,
)
from transformer_lab.feedforward import FeedForward  # chapter 05
from transformer_lab.residual import Residual, sublayer_connection  # chapter 05
from transformer_lab.encoder import Encoder, EncoderLayer  # chapter 06
from transformer_lab.decoder import Decoder, DecoderCache, DecoderLayer, LayerCache  # chapter 07
from transformer_lab.embedding import PositionalEncoding, TokenEmbedding, sinusoidal_encoding  # chapter 08
from transformer_lab.model import (  # chapter 09
    Transformer,
    TransformerConfig,
    count_parameters,
    load_checkpoint,
    save_checkpoint,
)
from transformer_lab.gpt import GPT, GPTConfig  # chapter 10 (chapter 11: its switches)
from transformer_lab.feedforward import SwiGLU  # chapter 11
from transformer_lab.modern import RotaryEmbedding  # chapter 11
from transformer_lab.i18n import get_language, set_language  # the language of checks and hints (en, zh)
from transformer_lab.device import mps_gaps, pick_device  # the optional GPU cells' device (chapter 00)

__version__ = "0.1.0"

__all__ = [
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "target_mask",
    "invert_mask",
    "to_additive_mask",
    "from_additive_mask",
    "MultiHeadAttention",
    "record_attention",
    "LayerNorm",
    "BatchNorm",
    "layer_norm_statistics",
    "batch_norm_statistics",
    "FeedForward",
    "sublayer_connection",
    "Residual",
    "EncoderLayer",
    "Encoder",
    "DecoderLayer",
    "Decoder",
    "LayerCache",
    "DecoderCache",
    "TokenEmbedding",
    "PositionalEncoding",
    "sinusoidal_encoding",
    "TransformerConfig",
    "Transformer",
    "count_parameters",
    "save_checkpoint",
    "load_checkpoint",
    "GPTConfig",
    "GPT",
    "SwiGLU",
    "RotaryEmbedding",
    "set_language",
    "get_language",
    "pick_device",
    "mps_gaps",
]

# Course machinery and chapter 09's tools, imported on first use (`tl.plotting`, `tl.widgets`, ...)
# so that `import transformer_lab` alone stays light for an engineer who only wants the model.
_SUBMODULES = (
    "plotting",
    "widgets",
    "exercises",
    "diagnostics",
    "data",
    "training",
    "loop",
    "gpt_training",
    "decoding",
    "shipped",
    "i18n",
    "hf",
    "muon",
    "optim",
    "finetune",
    "bpe",
)


def __getattr__(name: str):  # noqa: ANN202 - module-level lazy import (PEP 562)
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
