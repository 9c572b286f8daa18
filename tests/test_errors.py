"""Bad input gets a ValueError or TypeError whose message names the argument (every module)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from torch import nn

import transformer_lab as tl

D, H = 8, 2


@functools.cache
def _model() -> tl.Transformer:
    torch.manual_seed(0)
    return tl.Transformer(tl.TransformerConfig(13, 13, d_model=D, n_heads=H, d_ff=16, n_layers=1, max_len=10))


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _tok(*shape: int) -> torch.Tensor:
    return torch.randint(1, 13, shape, generator=torch.Generator().manual_seed(0))


def _mha(*args: object, **kwargs: object) -> torch.Tensor:
    x = _x(2, 3, D)
    return tl.MultiHeadAttention(D, H)(x, x, x, *args, **kwargs)


CASES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    # ------------------------------------------------------------ sizes and configurations
    (
        "d_model not divisible by n_heads",
        lambda: tl.MultiHeadAttention(10, 3),
        ValueError,
        r"d_model.*divisible.*n_heads",
    ),
    (
        "config d_model/n_heads",
        lambda: tl.TransformerConfig(5, 5, d_model=10, n_heads=3),
        ValueError,
        r"d_model.*n_heads",
    ),
    ("layer d_model/n_heads", lambda: tl.EncoderLayer(10, 4, 16), ValueError, r"d_model.*divisible"),
    ("zero heads", lambda: tl.MultiHeadAttention(D, 0), ValueError, r"n_heads must be a positive int"),
    ("float d_model", lambda: tl.MultiHeadAttention(8.0, 2), TypeError, r"d_model must be a positive int"),
    ("negative dropout", lambda: tl.MultiHeadAttention(D, H, dropout=-0.1), ValueError, r"dropout must be in \[0, 1\)"),
    ("dropout of one", lambda: tl.FeedForward(D, 16, dropout=1.0), ValueError, r"dropout must be in \[0, 1\)"),
    ("dropout as a string", lambda: tl.EncoderLayer(D, H, 16, dropout="0.1"), TypeError, r"dropout must be a float"),
    ("config negative dropout", lambda: tl.TransformerConfig(5, 5, dropout=-0.5), ValueError, r"dropout"),
    ("config zero vocabulary", lambda: tl.TransformerConfig(0, 5), ValueError, r"src_vocab_size"),
    ("config float layers", lambda: tl.TransformerConfig(5, 5, n_layers=2.0), TypeError, r"n_layers"),
    ("config norm_first string", lambda: tl.TransformerConfig(5, 5, norm_first="no"), TypeError, r"norm_first"),
    ("config activation", lambda: tl.TransformerConfig(5, 5, activation="tanh"), ValueError, r"activation"),
    ("config max_len", lambda: tl.TransformerConfig(5, 5, max_len=0), ValueError, r"max_len"),
    (
        "tied embeddings, different vocabularies",
        lambda: tl.TransformerConfig(5, 6, tie_embeddings=True),
        ValueError,
        r"tie_embeddings.*src_vocab_size.*tgt_vocab_size",
    ),
    (
        "base with tied different vocabularies",
        lambda: tl.TransformerConfig.base(100, 200),
        ValueError,
        "tie_embeddings",
    ),
    (
        "config of the wrong type",
        lambda: tl.Transformer({"d_model": 8}),
        TypeError,
        r"config must be a TransformerConfig",
    ),
    ("layer norm_first string", lambda: tl.EncoderLayer(D, H, 16, norm_first="no"), TypeError, r"norm_first"),
    ("decoder norm_first int", lambda: tl.Decoder(D, H, 16, 1, norm_first=1), TypeError, r"norm_first"),
    ("stack with no layers", lambda: tl.Encoder(D, H, 16, 0), ValueError, r"n_layers"),
    ("record_weights string", lambda: tl.MultiHeadAttention(D, H, record_weights="yes"), TypeError, "record_weights"),
    ("ffn activation", lambda: tl.FeedForward(D, 16, activation="tanh"), ValueError, r"activation must be one of"),
    ("ffn zero width", lambda: tl.FeedForward(D, 0), ValueError, r"d_ff"),
    ("layer norm eps", lambda: tl.LayerNorm(D, eps=-1e-5), ValueError, r"eps must be a positive"),
    ("batch norm eps", lambda: tl.BatchNorm(D, eps=0.0), ValueError, r"eps must be a positive"),
    ("batch norm momentum", lambda: tl.BatchNorm(D, momentum=2.0), ValueError, r"momentum"),
    ("embedding vocabulary", lambda: tl.TokenEmbedding(0, D), ValueError, r"vocab_size"),
    ("positional max_len", lambda: tl.PositionalEncoding(D, max_len=0), ValueError, r"max_len"),
    ("positional dropout", lambda: tl.PositionalEncoding(D, dropout=1.5), ValueError, r"dropout"),
    ("residual sublayer", lambda: tl.Residual(lambda x: x, D), TypeError, r"sublayer must be an nn.Module"),
    # ------------------------------------------------------------ masks
    ("float (additive) mask", lambda: _mha(torch.zeros(3, 3)), TypeError, r"mask must be a bool tensor.*may attend"),
    ("int mask", lambda: _mha(torch.ones(3, 3, dtype=torch.long)), TypeError, r"mask must be a bool tensor"),
    ("mask as a list", lambda: _mha([[True]]), TypeError, r"mask must be a bool torch.Tensor"),
    (
        "mask of the wrong length",
        lambda: _mha(torch.ones(2, 1, 1, 4, dtype=torch.bool)),
        ValueError,
        r"mask of shape \(2, 1, 1, 4\)",
    ),
    (
        "2-D (B, S) padding mask",
        lambda: _mha(torch.ones(2, 4, dtype=torch.bool)),
        ValueError,
        r"padding mask is \(B, 1, 1, S\)",
    ),
    (
        "mask with too many dims",
        lambda: _mha(torch.ones(1, 2, 1, 3, 3, dtype=torch.bool)),
        ValueError,
        r"cannot be broadcast",
    ),
    (
        "attention function, float mask",
        lambda: tl.scaled_dot_product_attention(_x(3, 4), _x(3, 4), _x(3, 4), torch.zeros(3, 3)),
        TypeError,
        r"mask must be a bool",
    ),
    ("causal_mask size zero", lambda: tl.causal_mask(0), ValueError, r"size must be a positive int"),
    ("causal_mask float size", lambda: tl.causal_mask(2.5), TypeError, r"size must be a positive int"),
    ("padding_mask float tokens", lambda: tl.padding_mask(_x(2, 3), 0), TypeError, r"tokens must be an integer"),
    ("padding_mask 1-D tokens", lambda: tl.padding_mask(_tok(3), 0), ValueError, r"tokens must have 2 dimensions"),
    ("padding_mask float pad_id", lambda: tl.padding_mask(_tok(2, 3), 0.0), TypeError, r"pad_id must be an int"),
    ("target_mask pad_id None", lambda: tl.target_mask(_tok(2, 3), None), TypeError, r"pad_id must be an int"),
    ("invert a float mask", lambda: tl.invert_mask(torch.zeros(2, 2)), TypeError, r"mask must be a bool"),
    ("additive mask to int dtype", lambda: tl.to_additive_mask(tl.causal_mask(2), torch.long), TypeError, r"dtype"),
    ("from_additive of a bool mask", lambda: tl.from_additive_mask(tl.causal_mask(2)), TypeError, r"floating-point"),
    # ------------------------------------------------------------ attention inputs
    (
        "attention, list query",
        lambda: tl.scaled_dot_product_attention([1.0], _x(3, 4), _x(3, 4)),
        TypeError,
        r"query must be a torch.Tensor",
    ),
    (
        "attention, 1-D query",
        lambda: tl.scaled_dot_product_attention(_x(4), _x(3, 4), _x(3, 4)),
        ValueError,
        r"query must have at least 2",
    ),
    (
        "attention, d_k differs",
        lambda: tl.scaled_dot_product_attention(_x(2, 4), _x(3, 5), _x(3, 5)),
        ValueError,
        r"key must have the same last dimension d_k",
    ),
    (
        "attention, values per key",
        lambda: tl.scaled_dot_product_attention(_x(2, 4), _x(3, 4), _x(2, 4)),
        ValueError,
        r"value must have one vector per key",
    ),
    (
        "attention, batch dims differ",
        lambda: tl.scaled_dot_product_attention(_x(2, 2, 4), _x(3, 3, 4), _x(3, 3, 4)),
        ValueError,
        r"leading batch dimensions",
    ),
    (
        "attention, dropout as a float",
        lambda: tl.scaled_dot_product_attention(_x(2, 4), _x(2, 4), _x(2, 4), dropout=0.1),
        TypeError,
        r"dropout must be an nn.Dropout",
    ),
    (
        "mha (B, T) input",
        lambda: tl.MultiHeadAttention(D, H)(_x(2, D), _x(2, D), _x(2, D)),
        ValueError,
        r"query must have 3 dimensions",
    ),
    (
        "mha wrong d_model",
        lambda: tl.MultiHeadAttention(D, H)(_x(2, 3, 6), _x(2, 3, 6), _x(2, 3, 6)),
        ValueError,
        r"query must have last dimension d_model=8",
    ),
    (
        "mha token ids",
        lambda: tl.MultiHeadAttention(D, H)(*(_tok(2, 3, D),) * 3),
        TypeError,
        r"query must be a floating-point",
    ),
    (
        "mha batch differs",
        lambda: tl.MultiHeadAttention(D, H)(_x(2, 3, D), _x(1, 3, D), _x(1, 3, D)),
        ValueError,
        r"same batch size",
    ),
    (
        "mha key/value lengths",
        lambda: tl.MultiHeadAttention(D, H)(_x(2, 3, D), _x(2, 3, D), _x(2, 4, D)),
        ValueError,
        r"key and value must have the same length",
    ),
    # ------------------------------------------------------------ layers
    (
        "layer norm (B, T) wrong D",
        lambda: tl.LayerNorm(D)(_x(2, 5)),
        ValueError,
        r"x must have last dimension d_model=8",
    ),
    ("layer norm ints", lambda: tl.LayerNorm(D)(_tok(2, D)), TypeError, r"x must be a floating-point"),
    ("batch norm 2-D input", lambda: tl.BatchNorm(D)(_x(4, D)), ValueError, r"x must have 3 dimensions"),
    (
        "batch norm float mask",
        lambda: tl.BatchNorm(D)(_x(2, 3, D), torch.ones(2, 3)),
        TypeError,
        r"mask must be a bool",
    ),
    (
        "batch norm mask shape",
        lambda: tl.BatchNorm(D)(_x(2, 3, D), torch.ones(2, 4, dtype=torch.bool)),
        ValueError,
        r"mask must have shape \(B, T\)",
    ),
    ("batch norm one token", lambda: tl.BatchNorm(D)(_x(1, 1, D)), ValueError, r"at least 2 real tokens"),
    ("statistics of ints", lambda: tl.batch_norm_statistics(_tok(2, 3, D)), TypeError, r"x must be a floating-point"),
    (
        "ffn wrong d_model",
        lambda: tl.FeedForward(D, 16)(_x(2, 3, 5)),
        ValueError,
        r"x must have last dimension d_model=8",
    ),
    (
        "encoder layer (B, T) input",
        lambda: tl.EncoderLayer(D, H, 16)(_x(3, D)),
        ValueError,
        r"x must have 3 dimensions",
    ),
    ("encoder layer token ids", lambda: tl.EncoderLayer(D, H, 16)(_tok(2, 3)), ValueError, r"x must have 3 dimensions"),
    (
        "encoder wrong d_model",
        lambda: tl.Encoder(D, H, 16, 1)(_x(2, 3, 4)),
        ValueError,
        r"x must have last dimension d_model=8",
    ),
    (
        "decoder memory d_model",
        lambda: tl.DecoderLayer(D, H, 16)(_x(2, 3, D), _x(2, 4, 6)),
        ValueError,
        r"memory must have last dimension",
    ),
    (
        "decoder memory batch",
        lambda: tl.Decoder(D, H, 16, 1)(_x(2, 3, D), _x(3, 4, D)),
        ValueError,
        r"memory must have the same batch size",
    ),
    (
        "decoder tgt_mask shape",
        lambda: tl.DecoderLayer(D, H, 16)(_x(2, 3, D), _x(2, 4, D), tgt_mask=tl.causal_mask(4)),
        ValueError,
        r"tgt_mask of shape \(4, 4\)",
    ),
    (
        "decoder memory_mask shape",
        lambda: tl.DecoderLayer(D, H, 16)(
            _x(2, 3, D), _x(2, 4, D), memory_mask=torch.ones(2, 1, 1, 3, dtype=torch.bool)
        ),
        ValueError,
        r"memory_mask of shape",
    ),
    (
        "embedding float tokens",
        lambda: tl.TokenEmbedding(13, D)(_x(2, 3)),
        TypeError,
        r"tokens must be an integer tensor",
    ),
    (
        "embedding out of vocabulary",
        lambda: tl.TokenEmbedding(13, D)(torch.tensor([[1, 13]])),
        ValueError,
        r"tokens contains token id 13, outside the vocabulary \[0, 13\)",
    ),
    ("embedding negative id", lambda: tl.TokenEmbedding(13, D)(torch.tensor([[-1, 2]])), ValueError, r"token id -1"),
    (
        "embedding 3-D tokens",
        lambda: tl.TokenEmbedding(13, D)(_tok(2, 3, 1)),
        ValueError,
        r"tokens must have shape \(batch, seq_len\)",
    ),
    (
        "positional longer than max_len",
        lambda: tl.PositionalEncoding(D, max_len=4)(_x(1, 5, D)),
        ValueError,
        r"longer than max_len=4",
    ),
    (
        "positional start past max_len",
        lambda: tl.PositionalEncoding(D, max_len=4)(_x(1, 2, D), start=3),
        ValueError,
        r"max_len=4",
    ),
    (
        "positional float start",
        lambda: tl.PositionalEncoding(D, max_len=4)(_x(1, 2, D), start=1.0),
        TypeError,
        r"start must be an int",
    ),
    (
        "positional wrong d_model",
        lambda: tl.PositionalEncoding(D)(_x(1, 2, 4)),
        ValueError,
        r"x must have last dimension d_model=8",
    ),
    # ------------------------------------------------------------ the model
    ("src longer than max_len", lambda: _model()(_tok(2, 11), _tok(2, 3)), ValueError, r"max_len=10"),
    ("tgt longer than max_len", lambda: _model()(_tok(2, 3), _tok(2, 11)), ValueError, r"max_len=10"),
    (
        "src id out of vocabulary",
        lambda: _model()(torch.tensor([[1, 20]]), _tok(1, 2)),
        ValueError,
        r"src contains token id 20",
    ),
    (
        "tgt id out of vocabulary",
        lambda: _model()(_tok(1, 2), torch.tensor([[13]])),
        ValueError,
        r"tgt contains token id 13",
    ),
    (
        "src and tgt batch sizes",
        lambda: _model()(_tok(2, 3), _tok(3, 3)),
        ValueError,
        r"src and tgt must have the same batch size",
    ),
    ("float src tokens", lambda: _model()(_x(2, 3), _tok(2, 3)), TypeError, r"src must be an integer tensor"),
    (
        "bool tgt tokens",
        lambda: _model()(_tok(2, 3), torch.ones(2, 3, dtype=torch.bool)),
        TypeError,
        r"tgt must be an integer tensor",
    ),
    ("1-D src", lambda: _model()(_tok(3), _tok(2, 3)), ValueError, r"src must have 2 dimensions"),
    (
        "embedded src instead of ids",
        lambda: _model()(_x(2, 3, D), _tok(2, 3)),
        ValueError,
        r"src must have 2 dimensions",
    ),
    ("src as a list", lambda: _model()([[1, 2]], _tok(1, 2)), TypeError, r"src must be a torch.Tensor"),
    ("empty tgt", lambda: _model()(_tok(2, 3), _tok(2, 0)), ValueError, r"tgt must hold at least one token"),
    ("empty src", lambda: _model().encode(_tok(2, 0)), ValueError, r"src must hold at least one token"),
    (
        "src_mask float",
        lambda: _model()(_tok(2, 3), _tok(2, 3), src_mask=torch.zeros(2, 1, 1, 3)),
        TypeError,
        r"src_mask must be a bool",
    ),
    (
        "src_mask wrong length",
        lambda: _model()(_tok(2, 3), _tok(2, 3), src_mask=torch.ones(2, 1, 1, 4, dtype=torch.bool)),
        ValueError,
        r"src_mask of shape",
    ),
    (
        "tgt_mask wrong size",
        lambda: _model()(_tok(2, 3), _tok(2, 4), tgt_mask=tl.causal_mask(3)),
        ValueError,
        r"tgt_mask of shape \(3, 3\)",
    ),
    (
        "PyTorch-style float tgt_mask",
        lambda: _model()(_tok(2, 3), _tok(2, 3), tgt_mask=torch.zeros(3, 3)),
        TypeError,
        r"tgt_mask must be a bool",
    ),
    (
        "decode memory batch",
        lambda: _model().decode(_tok(2, 3), _x(3, 4, D)),
        ValueError,
        r"tgt and memory must have the same batch size",
    ),
    (
        "decode memory not a tensor",
        lambda: _model().decode(_tok(2, 3), [0.0]),
        TypeError,
        r"memory must be a torch.Tensor",
    ),
    (
        "decode memory wrong d_model",
        lambda: _model().decode(_tok(2, 3), _x(2, 4, 5)),
        ValueError,
        r"memory must have last dimension d_model=8",
    ),
    ("record_attention non-bool", lambda: tl.record_attention(_model(), "off"), TypeError, r"on must be True or False"),
    ("record_attention non-module", lambda: tl.record_attention("model"), TypeError, r"model must be an nn.Module"),
    ("count_parameters non-module", lambda: tl.count_parameters({"w": 1}), TypeError, r"model must be an nn.Module"),
    (
        "save_checkpoint non-Transformer",
        lambda: tl.save_checkpoint(nn.Linear(2, 2), "unused.pt"),
        TypeError,
        r"model must be a Transformer",
    ),
]


@pytest.mark.parametrize(("call", "error", "match"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(call: Callable[[], object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_checks_do_not_reject_good_input() -> None:
    """The same entry points accept the input they document (so the cases above fail for the stated reason)."""
    model = _model()
    src, tgt = _tok(2, 3), _tok(2, 4)
    assert model(src, tgt, tl.padding_mask(src, 0), tl.target_mask(tgt, 0)).shape == (2, 4, 13)
    x = _x(2, 3, D)
    assert tl.MultiHeadAttention(D, H)(x, x, x, tl.causal_mask(3)).shape == (2, 3, D)
    assert tl.DecoderLayer(D, H, 16)(
        x, _x(2, 4, D), tl.causal_mask(3), torch.ones(2, 1, 1, 4, dtype=torch.bool)
    ).shape == (2, 3, D)
    assert tl.PositionalEncoding(D, max_len=4)(_x(1, 2, D), start=2).shape == (1, 2, D)
    assert tl.BatchNorm(D)(_x(2, 3, D), torch.ones(2, 3, dtype=torch.bool)).shape == (2, 3, D)
