"""TransformerConfig, Transformer, count_parameters and checkpoints (chapter 09)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

import transformer_lab as tl

VOCAB = 37000  # the paper's shared English-German BPE vocabulary


def _small(**overrides: object) -> tl.TransformerConfig:
    settings: dict[str, object] = dict(d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=32, dropout=0.0)
    settings.update(overrides)
    return tl.TransformerConfig(13, 13, **settings)


def _batch(seed: int = 0, vocab: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (2, 6), generator=g), torch.randint(1, vocab, (2, 5), generator=g)


# ---------------------------------------------------------------- parameter counts


def _expected_count(d: int, h: int, d_ff: int, n: int, vocab: int, tied: bool, final_norms: bool) -> dict[str, int]:
    """The parameter count written out layer by layer (h does not change it: the heads split D)."""
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O, each D x D plus a bias
    ffn = (d * d_ff + d_ff) + (d_ff * d + d)  # W_1, b_1, W_2, b_2
    norm = 2 * d  # gamma and beta
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm  # self- and cross-attention
    embeddings = vocab * d if tied else 2 * vocab * d
    output = 0 if tied else vocab * d  # pre-softmax Linear without bias
    stack_norms = 2 * norm if final_norms else 0
    return {
        "attention": n * attention * 3,
        "feed_forward": n * ffn * 2,
        "norms": n * norm * 5 + stack_norms,
        "embeddings": embeddings,
        "output": output,
        "other": 0,
        "total": n * (encoder_layer + decoder_layer) + stack_norms + embeddings + output,
    }


def _on_meta(config: tl.TransformerConfig) -> tl.Transformer:
    with torch.device("meta"):  # shapes only: no memory, no initialization cost
        return tl.Transformer(config)


def _torch_transformer_params(d: int, h: int, d_ff: int, n: int) -> int:
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        reference = nn.Transformer(d, h, n, n, d_ff, batch_first=True)
    return sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize(
    ("name", "d", "h", "d_ff", "paper_millions"),
    [("base", 512, 8, 2048, 65), ("big", 1024, 16, 4096, 213)],
)
def test_paper_configurations_parameter_counts(name: str, d: int, h: int, d_ff: int, paper_millions: int) -> None:
    config = getattr(tl.TransformerConfig, name)(VOCAB, VOCAB)
    assert (config.d_model, config.n_heads, config.d_ff, config.n_layers) == (d, h, d_ff, 6)
    assert config.tie_embeddings and not config.norm_first  # the paper: shared matrix, Post-Norm
    model = _on_meta(config)
    counts = tl.count_parameters(model)
    assert counts == _expected_count(d, h, d_ff, 6, VOCAB, tied=True, final_norms=False)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    # nn.Transformer has the same layers plus a final LayerNorm on each stack, and no embeddings.
    assert counts["total"] == _torch_transformer_params(d, h, d_ff, 6) - 2 * (2 * d) + VOCAB * d
    # Table 3 says 65M and 213M; with one 37000-token table we get 63.1M and 214.2M (chapter 09 explains the gap).
    assert abs(counts["total"] / 1e6 - paper_millions) / paper_millions < 0.05


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("norm_first", [True, False])
def test_count_parameters_by_component(tied: bool, norm_first: bool) -> None:
    config = _small(tie_embeddings=tied, norm_first=norm_first)
    model = tl.Transformer(config)
    counts = tl.count_parameters(model)
    assert counts == _expected_count(16, 2, 32, 2, 13, tied=tied, final_norms=norm_first)
    assert sum(v for k, v in counts.items() if k != "total") == counts["total"]
    assert counts["total"] == sum(p.numel() for p in model.parameters())  # shared tensors once
    if norm_first:
        assert counts["total"] == _torch_transformer_params(16, 2, 32, 2) + counts["embeddings"] + counts["output"]


def test_count_parameters_of_a_plain_module_puts_the_rest_in_other() -> None:
    counts = tl.count_parameters(nn.Sequential(nn.Linear(3, 4), tl.LayerNorm(4)))
    assert counts["other"] == 16 and counts["norms"] == 8 and counts["total"] == 24


# ---------------------------------------------------------------- config


def test_config_is_frozen_and_round_trips_as_a_dict() -> None:
    config = _small()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 8  # type: ignore[misc]
    as_dict = config.to_dict()
    assert as_dict == dataclasses.asdict(config) and type(as_dict) is dict
    assert tl.TransformerConfig(**as_dict) == config


def test_base_and_big_accept_overrides() -> None:
    config = tl.TransformerConfig.base(100, 100, n_layers=2, norm_first=True)
    assert config.n_layers == 2 and config.norm_first and config.d_model == 512
    assert tl.TransformerConfig.big(100, 100).dropout == 0.3
    assert tl.TransformerConfig.base(100, 200, tie_embeddings=False).tgt_vocab_size == 200


# ---------------------------------------------------------------- the model


def test_forward_shapes_and_equals_encode_then_decode() -> None:
    torch.manual_seed(0)
    model = tl.Transformer(_small()).eval()
    src, tgt = _batch()
    logits = model(src, tgt)
    assert logits.shape == (2, 5, 13)
    memory = model.encode(src)
    assert memory.shape == (2, 6, 16)
    torch.testing.assert_close(model.decode(tgt, memory), logits, atol=0, rtol=0)


def test_forward_default_tgt_mask_is_causal_and_src_mask_none_means_all_visible() -> None:
    torch.manual_seed(0)
    model = tl.Transformer(_small()).double().eval()
    src, tgt = _batch()
    out = model(src, tgt)
    torch.testing.assert_close(out, model(src, tgt, tgt_mask=tl.causal_mask(5)), atol=0, rtol=0)
    all_visible = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    torch.testing.assert_close(out, model(src, tgt, src_mask=all_visible), atol=0, rtol=0)
    assert not torch.allclose(out, model(src, tgt, tgt_mask=torch.ones(5, 5, dtype=torch.bool)))


def test_padding_mask_makes_padded_source_tokens_irrelevant() -> None:
    torch.manual_seed(0)
    model = tl.Transformer(_small()).double().eval()
    src, tgt = _batch()
    src[1, 4:] = 0
    other = src.clone()
    other[1, 4:] = 7  # different tokens at padded places
    out = model(src, tgt, src_mask=tl.padding_mask(src, 0))
    torch.testing.assert_close(out, model(other, tgt, src_mask=tl.padding_mask(src, 0)), atol=1e-10, rtol=0)


def test_tied_embeddings_share_one_matrix_and_gradients() -> None:
    model = tl.Transformer(_small(tie_embeddings=True))
    w = model.src_embed.embedding.weight
    assert model.tgt_embed.embedding.weight is w and model.generator.weight is w
    src, tgt = _batch()
    model(src, tgt).sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    untied = tl.Transformer(_small(tie_embeddings=False))
    weights = {
        id(untied.src_embed.embedding.weight),
        id(untied.tgt_embed.embedding.weight),
        id(untied.generator.weight),
    }
    assert len(weights) == 3


def test_initialization_scales() -> None:
    torch.manual_seed(0)
    model = tl.Transformer(tl.TransformerConfig(500, 500, d_model=64, n_heads=4, d_ff=128, n_layers=1))
    with torch.no_grad():
        embedded = model.src_embed(torch.arange(500)[None, :])
    assert 0.8 < float(embedded.std()) < 1.2  # N(0, 1/D) times sqrt(D): unit variance
    assert all(not m.bias.any() for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None)


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_round_trip(tmp_path, tied: bool) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    config = _small(tie_embeddings=tied, dropout=0.1)
    model = tl.Transformer(config).eval()
    src, tgt = _batch()
    path = tmp_path / "model.pt"
    tl.save_checkpoint(model, path, step=7)
    raw = torch.load(path, weights_only=True)
    assert type(raw["config"]) is dict and raw["config"] == dataclasses.asdict(config)
    assert raw["step"] == 7
    assert torch.equal(raw["state_dict"]["positional.pe"], model.positional.pe)
    loaded = tl.load_checkpoint(path).eval()
    assert loaded.config == config
    assert torch.equal(loaded.positional.pe, model.positional.pe)
    assert torch.equal(loaded(src, tgt), model(src, tgt))
    if tied:
        w = loaded.src_embed.embedding.weight
        assert loaded.tgt_embed.embedding.weight is w and loaded.generator.weight is w
        with torch.no_grad():
            w[0, 0] += 1.0  # still one tensor: the change shows in the output projection
        assert loaded.generator.weight[0, 0] == w[0, 0]


def test_load_checkpoint_refuses_something_else(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not a transformer_lab checkpoint"):
        tl.load_checkpoint(path)
