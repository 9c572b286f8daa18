"""tl.finetune (chapter 13): LoRA equal to Hugging Face PEFT, the SFT format and its masked loss, the
group-relative policy gradient against a direct float64 implementation, and the 藏头诗 rewards on hand-made poems.

PEFT's LoRA goes on a small random `LlamaForCausalLM` (float64, never downloaded), read into a GPT with chapter
11's `from_hf` (hf_float32, so that the models agree to chapter 11's 1e-10); the same A and B (B not zero) go into
both: logits, the gradients of A and B, and the merged weights agree. Tests that need transformers or peft skip
without them locally and fail under CI (tests/support.py).
"""

from __future__ import annotations

import copy
import importlib.util
import math

import pytest
import torch
from support import require
from torch import nn

from transformer_lab import finetune as ft
from transformer_lab import hf

HAS_PEFT = all(importlib.util.find_spec(m) is not None for m in ("transformers", "peft"))
PEFT_REASON = "transformers and peft are not installed (pip install -r requirements.txt)"
HAS_PYPINYIN = importlib.util.find_spec("pypinyin") is not None
PYPINYIN_REASON = "pypinyin is not installed (pip install -r requirements.txt)"
# PEFT calls a transformers method that transformers 5 deprecates; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
V, LENGTH = 61, 24
TOL = dict(rtol=1e-10, atol=1e-10)  # chapter 11's (tests/test_hf_modern.py)

# PEFT's module names -> the GPT's (tl.hf's table)
PEFT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
OUR_TARGETS = ["w_q", "w_k", "w_v", "w_o", "feed_forward.w1", "feed_forward.w2"]


def llama(**overrides: object):  # noqa: ANN201 - a transformers model
    """A float64 random LlamaForCausalLM with grouped-query attention, every parameter perturbed."""
    require(HAS_PEFT, PEFT_REASON)
    from transformers import LlamaConfig, LlamaForCausalLM

    values: dict[str, object] = dict(
        vocab_size=V, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=LENGTH, rms_norm_eps=1e-6, rope_theta=500.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    values.update(overrides)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**values)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def peft_model(reference, rank: int = 4, alpha: float = 8.0):  # noqa: ANN001, ANN201
    """PEFT's LoRA on PEFT_TARGETS of a copy of `reference`, with B drawn at random (not PEFT's zeros)."""
    import copy

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=PEFT_TARGETS)
    model = get_peft_model(copy.deepcopy(reference), config).double().eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def ours_from(reference, layout: str, rank: int = 4, alpha: float = 8.0):  # noqa: ANN001, ANN201
    model = hf.from_hf(reference.state_dict(), reference.config, rope_layout=layout, hf_float32=True)
    ft.apply_lora(model, OUR_TARGETS, rank=rank, alpha=alpha)
    return model.eval()


# ---------------------------------------------------------------- LoRA alone


def test_lora_linear_starts_as_its_base_and_trains_only_a_and_b() -> None:
    torch.manual_seed(0)
    base = nn.Linear(12, 7).double()
    lora = ft.LoRALinear(base, rank=3, alpha=6.0)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    assert torch.equal(lora(x), base(x))  # B = 0
    assert torch.count_nonzero(lora.lora_B) == 0 and lora.scale == 2.0
    assert [n for n, p in lora.named_parameters() if p.requires_grad] == ["lora_A", "lora_B"]
    lora(x).sum().backward()
    assert base.weight.grad is None and lora.lora_B.grad is not None


def test_lora_a_starts_as_a_linear_weight() -> None:
    """A is drawn as nn.Linear(in, r) draws its weight (Kaiming-uniform, a = sqrt(5)), PEFT's rule."""
    base = nn.Linear(40, 9)
    torch.manual_seed(5)
    lora = ft.LoRALinear(base, rank=6, alpha=1.0)
    torch.manual_seed(5)
    reference = nn.Linear(40, 6, bias=False)
    assert torch.equal(lora.lora_A, reference.weight)


def test_lora_forward_weight_merge_and_unmerge() -> None:
    torch.manual_seed(1)
    base = nn.Linear(10, 8).double()
    original = base.weight.detach().clone()
    lora = ft.LoRALinear(base, rank=2, alpha=5.0)
    nn.init.normal_(lora.lora_B)
    x = torch.randn(4, 10, dtype=torch.float64)
    update = 2.5 * lora.lora_B @ lora.lora_A
    expected = x @ (original + update).T + base.bias
    torch.testing.assert_close(lora(x), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.nn.functional.linear(x, lora.weight, lora.bias), expected)
    assert torch.linalg.matrix_rank(lora.delta_weight()) == 2
    lora.merge()
    assert lora.merged
    torch.testing.assert_close(base.weight, original + update, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lora(x), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="already merged"):
        lora.merge()
    lora.unmerge()
    torch.testing.assert_close(base.weight, original, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lora(x), expected, rtol=1e-12, atol=1e-12)


def test_lora_dropout_acts_on_the_update_only() -> None:
    torch.manual_seed(2)
    base = nn.Linear(6, 6)
    lora = ft.LoRALinear(base, rank=2, alpha=2.0, dropout=0.5).train()
    nn.init.normal_(lora.lora_B)
    x = torch.randn(3, 6)
    torch.manual_seed(9)
    y = lora(x)
    torch.manual_seed(9)
    kept = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.testing.assert_close(y, base(x) + lora.scale * kept @ lora.lora_A.T @ lora.lora_B.T)
    with pytest.raises(RuntimeError, match="dropout"):
        _ = lora.weight
    lora.eval()
    torch.testing.assert_close(lora(x), base(x) + x @ lora.delta_weight().T)


def test_apply_lora_on_a_gpt_freezes_the_rest_and_merges() -> None:
    from transformer_lab.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=30, block_size=16, d_model=32, n_heads=4, n_layers=2, tie_embeddings=False)
    model = GPT(config).double().eval()
    idx = torch.randint(0, 30, (2, 16))
    with torch.no_grad():
        before = model(idx)
    names = ft.apply_lora(model, ["w_q", "w_v", "lm_head"], rank=4, alpha=8)
    assert names == ["layers.0.self_attn.w_q", "layers.0.self_attn.w_v", "layers.1.self_attn.w_q",
                     "layers.1.self_attn.w_v", "lm_head"]  # fmt: skip
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable) and len(trainable) == 10
    with torch.no_grad():
        torch.testing.assert_close(model(idx), before, rtol=0, atol=0)  # B = 0: the same model
        for p in ft.lora_parameters(model):
            if p.shape[1] == 4:  # the B's
                p.normal_()
        adapted = model(idx)
        assert not torch.allclose(adapted, before)
        # KV cache and generation go through the LoRA layers as well
        cache = model.new_cache()
        stepped = torch.cat([model(idx[:, :10], cache), model(idx[:, 10:11], cache), model(idx[:, 11:], cache)], 1)
        torch.testing.assert_close(stepped, adapted, rtol=1e-10, atol=1e-10)
        ft.merge_lora(model)
        torch.testing.assert_close(model(idx), adapted, rtol=1e-10, atol=1e-10)
        ft.unmerge_lora(model)
        torch.testing.assert_close(model(idx), adapted, rtol=1e-10, atol=1e-10)
    ft.unload_lora(model)
    assert not ft.lora_modules(model) and type(model.lm_head) is nn.Linear
    assert all(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(idx), adapted, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(rank=0), ValueError, "rank"),
        (dict(rank=-2), ValueError, "rank"),
        (dict(rank=2.0), TypeError, "rank"),
        (dict(alpha=0), ValueError, "alpha"),
        (dict(alpha=-1.0), ValueError, "alpha"),
        (dict(dropout=1.0), ValueError, "dropout"),
        (dict(dropout=-0.1), ValueError, "dropout"),
        (dict(targets=["w_x"]), ValueError, "targets: 'w_x' matches no nn.Linear"),
        (dict(targets=["self_attn"]), ValueError, "MultiHeadAttention"),
        (dict(targets=[]), TypeError, "targets"),
        (dict(targets=["lm_head"]), ValueError, "tied"),
        (dict(targets=["w_k"], dropout=0.1), ValueError, "dropout must be 0"),
    ],
)
def test_bad_lora_settings_name_the_argument(kwargs: dict, error: type, match: str) -> None:
    from transformer_lab.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, block_size=8, d_model=16, n_heads=2, n_layers=1))  # tied head
    settings = dict(targets=["w_q"], rank=2, alpha=4.0, dropout=0.0) | kwargs
    with pytest.raises(error, match=match):
        ft.apply_lora(model, settings.pop("targets"), **settings)
    assert not ft.lora_modules(model) and all(p.requires_grad for p in model.parameters())  # left unchanged


def test_lora_twice_on_one_layer_is_refused() -> None:
    from transformer_lab.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, block_size=8, d_model=16, n_heads=2, n_layers=1))
    ft.apply_lora(model, ["w_q"], rank=2)
    with pytest.raises(ValueError, match="already has LoRA"):
        ft.apply_lora(model, ["w_q"], rank=2)
    with pytest.raises(ValueError, match="no LoRA layers"):
        ft.merge_lora(GPT(GPTConfig(vocab_size=20, block_size=8, d_model=16, n_heads=2, n_layers=1)))


# ---------------------------------------------------------------- equal to Hugging Face PEFT


@pytest.mark.parametrize("layout", ["halves", "pairs"])
def test_lora_logits_and_gradients_equal_peft(layout: str) -> None:
    """The same A and B (B random) in PEFT's LoraConfig on a Llama and in ours on the GPT read from it: float64
    logits and the gradients of every A and B equal to 1e-10; in the pairs layout B's q and k rows permuted."""
    reference = llama()
    theirs = peft_model(reference)
    ours = ours_from(reference, layout)
    filled = ft.load_peft_lora(ours, theirs.state_dict())
    assert len(filled) == 2 * len(OUR_TARGETS)
    idx = tokens(2, LENGTH)
    weights = torch.randn(2, LENGTH, V, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    expected = theirs(idx).logits
    (expected * weights).sum().backward()
    logits = ours(idx)
    (logits * weights).sum().backward()
    torch.testing.assert_close(logits, expected, **TOL)
    mine = ft.lora_modules(ours)
    d_k = ours.config.d_k
    compared = 0
    for name, p in theirs.named_parameters():
        if "lora_" not in name:
            assert p.grad is None or not p.requires_grad  # PEFT freezes the base too
            continue
        i, theirs_name = name.split("layers.")[1].split(".", 1)
        module = theirs_name.split(".lora_")[0]
        which = "lora_A" if ".lora_A." in name else "lora_B"
        layer = mine[f"layers.{i}.{hf._LAYER_NAMES[module]}"]
        grad = p.grad
        if layout == "pairs" and which == "lora_B" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = 4 if module == "self_attn.q_proj" else 2
            grad = hf._halves_to_pairs(grad, heads, d_k)
        torch.testing.assert_close(getattr(layer, which).grad, grad, **TOL)
        compared += 1
    assert compared == 4 * len(OUR_TARGETS)  # 2 layers x targets x (A, B)


def test_pairs_layout_needs_bs_rows_permuted() -> None:
    """Copying PEFT's B into the pairs-layout GPT unpermuted gives another model: the permutation matters."""
    reference = llama()
    theirs = peft_model(reference)
    ours = ours_from(reference, "pairs")
    ft.load_peft_lora(ours, theirs.state_dict())
    idx = tokens(1, LENGTH)
    with torch.no_grad():
        expected = theirs(idx).logits
        torch.testing.assert_close(ours(idx), expected, **TOL)
        q = ft.lora_modules(ours)["layers.0.self_attn.w_q"]
        unpermuted = dict(theirs.named_parameters())[
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
        ]
        assert not torch.equal(q.lora_B, unpermuted)
        q.lora_B.copy_(unpermuted)
        assert (ours(idx) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("layout", ["halves", "pairs"])
def test_merged_weights_equal_peft_merge_and_unload(layout: str) -> None:
    """Our merged GPT holds the weights of PEFT's `merge_and_unload` read by `from_hf` (which permutes them in the
    pairs layout), to 1e-12; and the merged model computes the unmerged one's logits."""
    reference = llama()
    theirs = peft_model(reference)
    ours = ours_from(reference, layout)
    ft.load_peft_lora(ours, theirs.state_dict())
    idx = tokens(2, LENGTH)
    with torch.no_grad():
        unmerged = ours(idx)
    merged = theirs.merge_and_unload()
    expected = hf.from_hf(merged.state_dict(), merged.config, rope_layout=layout, hf_float32=True).state_dict()
    ft.unload_lora(ours)
    got = ours.state_dict()
    assert got.keys() == expected.keys()
    for key in got:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-12, atol=1e-12, msg=key)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), unmerged, **TOL)
        torch.testing.assert_close(ours(idx), merged(idx).logits, **TOL)


def test_load_peft_lora_refuses_an_adapter_that_does_not_fit() -> None:
    reference = llama()
    theirs = peft_model(reference)
    ours = hf.from_hf(reference.state_dict(), reference.config, hf_float32=True)
    ft.apply_lora(ours, ["w_q"], rank=4, alpha=8)
    with pytest.raises(ValueError, match="no LoRA on"):
        ft.load_peft_lora(ours, theirs.state_dict())
    other = hf.from_hf(reference.state_dict(), reference.config, hf_float32=True)
    ft.apply_lora(other, OUR_TARGETS, rank=2, alpha=8)
    with pytest.raises(ValueError, match="rank"):
        ft.load_peft_lora(other, theirs.state_dict())


# ---------------------------------------------------------------- the SFT format, the grown vocabulary, the masked loss


def tang():  # noqa: ANN201 - (GPT, TextTokenizer)
    from transformer_lab.data import ASSETS
    from transformer_lab.gpt_training import load_gpt

    return load_gpt(ASSETS / "gpt_tang.pt")


def test_format_encodes_prompt_and_response_and_masks_the_prompt() -> None:
    from transformer_lab.data import TextTokenizer

    tokenizer = TextTokenizer("，。山水风月")
    fmt = ft.SFTFormat(base_vocab=tokenizer.vocab_size)
    assert (fmt.prompt_id, fmt.response_id, fmt.end_id, fmt.vocab_size) == (6, 7, 8, 9)
    inputs, targets, mask = fmt.encode(tokenizer, "山水", "风月。")
    full = [6, 2, 3, 7, 4, 5, 1, 8]  # <|prompt|> 山 水 <|response|> 风 月 。 <|end|>
    assert inputs.tolist() == full[:-1] and targets.tolist() == full[1:]
    # the targets 风 月 。 <|end|> are learned; 山 水 <|response|> (given by the prompt) are not
    assert mask.tolist() == [False, False, False, True, True, True, True]
    assert fmt.prompt_ids(tokenizer, "山水") == [6, 2, 3, 7]
    assert fmt.decode_response(tokenizer, [4, 5, 1, 8, 2, 2]) == "风月。"
    x, y, m = fmt.batch(tokenizer, [("山", "风。"), ("山水风", "月")])
    assert x.shape == y.shape == m.shape == (2, 6)
    assert m.tolist() == [[False, False, True, True, True, False], [False, False, False, False, True, True]]
    assert ft.SFTFormat.from_dict(fmt.to_dict()) == fmt
    with pytest.raises(ValueError, match="base_vocab"):
        fmt.encode(TextTokenizer("山水"), "山", "水")
    with pytest.raises(ValueError, match="markers"):
        fmt.decode_response(tokenizer, [4, 6, 5])
    with pytest.raises(ValueError, match="base_vocab"):
        ft.SFTFormat(base_vocab=0)


def test_added_tokens_start_at_the_mean_row_and_change_no_old_prediction() -> None:
    """On chapter 10's trained Tang model (tied head): 3 rows more, each the mean row; the old tokens' logits are
    unchanged, each new token's logit is the mean of the old ones, so its probability is at most 1 / V."""
    model, tokenizer = tang()
    model = model.double()
    size = model.config.vocab_size
    grown = ft.add_special_tokens(model, 3)
    assert model.config.vocab_size == size and model.token_embedding.weight.shape[0] == size  # the input untouched
    assert grown.config.vocab_size == size + 3 and grown.lm_head.weight is grown.token_embedding.weight
    mean = model.token_embedding.weight.mean(0)
    for row in grown.token_embedding.weight[size:]:
        torch.testing.assert_close(row, mean)
    idx = tokenizer.encode("春眠不觉晓，处处闻啼鸟。")[None]
    with torch.no_grad():
        old, new = model(idx), grown(idx)
    torch.testing.assert_close(new[..., :size], old, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new[..., size:], old.mean(-1, keepdim=True).expand(-1, -1, 3), rtol=1e-12, atol=1e-12)
    probabilities = new.softmax(-1)
    assert (probabilities[..., size:] <= 1 / size).all()
    torch.testing.assert_close(probabilities[..., :size] / probabilities[..., :size].sum(-1, keepdim=True),
                               old.softmax(-1))  # fmt: skip
    # the new ids are valid input
    fmt = ft.SFTFormat(base_vocab=size)
    prompt = torch.tensor([fmt.prompt_ids(tokenizer, "春夏秋冬")])
    assert grown.generate(prompt, 5, temperature=0).shape == (1, 11)


def test_added_tokens_grow_an_untied_head_too() -> None:
    from transformer_lab.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, block_size=8, d_model=16, n_heads=2, n_layers=1, tie_embeddings=False))
    grown = ft.add_special_tokens(model, 2)
    assert grown.lm_head.weight is not grown.token_embedding.weight
    assert grown.lm_head.weight.shape == (32, 16)
    torch.testing.assert_close(grown.lm_head.weight[30], model.lm_head.weight.mean(0))
    torch.testing.assert_close(grown.token_embedding.weight[31], model.token_embedding.weight.mean(0))
    assert torch.equal(grown.lm_head.weight[:30], model.lm_head.weight)
    with pytest.raises(ValueError, match="count"):
        ft.add_special_tokens(model, 0)


def hand_response_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Written out: -log softmax(logits)[target] at every response position, summed, over their count."""
    total, count = torch.zeros((), dtype=logits.dtype), 0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if mask[b, t]:
                row = logits[b, t]
                total = total - (row[targets[b, t]] - torch.log(torch.exp(row).sum()))
                count += 1
    return total / count


def test_response_loss_is_the_hand_written_one_and_ignores_the_prompt() -> None:
    """Through the grown Tang model: the loss equals the loop above (float64), and the gradient reaching the logits
    is exactly zero at every prompt (and padding) position, not zero at the response ones."""
    model, tokenizer = tang()
    grown = ft.add_special_tokens(model.double(), 3)
    fmt = ft.SFTFormat(base_vocab=model.config.vocab_size)
    inputs, targets, mask = fmt.batch(tokenizer, [("春夏秋冬", "春风吹柳绿，"), ("山", "山高月小。")])
    logits = grown(inputs)
    logits.retain_grad()
    loss = ft.response_loss(logits, targets, mask)
    torch.testing.assert_close(loss, hand_response_loss(logits, targets, mask), rtol=1e-12, atol=1e-12)
    loss.backward()
    assert torch.count_nonzero(logits.grad[~mask]) == 0
    assert (logits.grad[mask].abs().sum(-1) > 0).all()
    # a loss over all positions would differ: the mask does something
    everything = torch.ones_like(mask)
    assert not torch.isclose(ft.response_loss(logits.detach(), targets, everything), loss.detach())


def test_response_loss_refuses_bad_input() -> None:
    logits = torch.randn(2, 3, 5)
    targets = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="no True"):
        ft.response_loss(logits, targets, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        ft.response_loss(logits, targets, torch.ones(2, 3))
    with pytest.raises(ValueError, match="targets"):
        ft.response_loss(logits, targets[:, :2], torch.ones(2, 3, dtype=torch.bool))


# ---------------------------------------------------------------- the group-relative policy gradient


def direct_objective(logp, rewards, mask, z_score, old=None, clip=None, ref=None, beta=0.0):  # noqa: ANN001, ANN201
    """The chapter's objective written out with loops over prompts, samples and tokens (float64): the
    advantage from the group's mean (and unbiased std + 1e-4), the on-policy or clipped term, the k3 KL, the sum
    over response tokens divided by their number; the loss is its negative."""
    prompts, group, length = logp.shape
    total, count = torch.zeros((), dtype=torch.float64), 0
    for p in range(prompts):
        mean = sum(float(rewards[p, g]) for g in range(group)) / group
        std = math.sqrt(sum((float(rewards[p, g]) - mean) ** 2 for g in range(group)) / (group - 1))
        for g in range(group):
            advantage = float(rewards[p, g]) - mean
            if z_score:
                advantage /= std + 1e-4
            for t in range(length):
                if not mask[p, g, t]:
                    continue
                if clip is None:
                    term = logp[p, g, t] * advantage
                else:
                    ratio = torch.exp(logp[p, g, t] - old[p, g, t])
                    value = ratio.item()
                    if value * advantage <= min(max(value, 1 - clip), 1 + clip) * advantage:
                        term = ratio * advantage  # the unclipped term is the smaller: it carries the gradient
                    else:
                        term = torch.tensor(min(max(value, 1 - clip), 1 + clip) * advantage, dtype=torch.float64)
                if beta > 0:
                    r = ref[p, g, t] - logp[p, g, t]
                    term = term - beta * (torch.exp(r) - r - 1)
                total = total + term
                count += 1
    return -total / count


def rl_batch(seed: int = 0):  # noqa: ANN201
    """3 prompts x 4 samples x 6 tokens: log-probs (a leaf), rewards with one tied group, ragged masks."""
    g = torch.Generator().manual_seed(seed)
    logp = (-2 * torch.rand(3, 4, 6, generator=g, dtype=torch.float64)).requires_grad_()
    rewards = torch.rand(3, 4, generator=g, dtype=torch.float64)
    rewards[1] = 0.5  # a group whose samples all score the same: advantage 0
    lengths = torch.randint(1, 7, (3, 4), generator=g)
    mask = torch.arange(6) < lengths.unsqueeze(-1)  # (3, 4, 6)
    old = (logp + 0.4 * torch.randn(3, 4, 6, generator=g, dtype=torch.float64)).detach()
    ref = (logp + 0.3 * torch.randn(3, 4, 6, generator=g, dtype=torch.float64)).detach()
    return logp, rewards, mask, old, ref


@pytest.mark.parametrize("z_score", [False, True])
@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_policy_gradient_loss_equals_the_direct_implementation(z_score: bool, clip: float | None, beta: float) -> None:
    """Every combination of the switches: the loss and its gradient in the log-probs equal the loops above."""
    logp, rewards, mask, old, ref = rl_batch()
    kwargs = dict(z_score=z_score, kl_coef=beta, ref_logprobs=ref if beta else None)
    if clip is not None:
        kwargs |= dict(clip=clip, old_logprobs=old)
    loss = ft.policy_gradient_loss(logp, rewards, mask, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    expected = direct_objective(logp, rewards, mask, z_score, old, clip, ref, beta)
    (expected_grad,) = torch.autograd.grad(expected, logp)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(grad[~mask]) == 0
    if beta == 0:
        assert torch.count_nonzero(grad[1]) == 0  # the tied group teaches nothing
    if clip is not None:  # some ratios are clipped here, so the switch is exercised
        ratio = torch.exp(logp - old)
        assert ((ratio[mask] > 1 + clip) | (ratio[mask] < 1 - clip)).any()


def test_default_objective_is_reinforce_with_the_group_mean_per_token() -> None:
    """Without switches: -(sum of log p times (reward - group mean)) / number of response tokens (nanochat)."""
    logp, rewards, mask, _, _ = rl_batch(1)
    advantage = rewards - rewards.mean(1, keepdim=True)
    expected = -(logp * advantage[..., None] * mask).sum() / mask.sum()
    torch.testing.assert_close(ft.policy_gradient_loss(logp, rewards, mask), expected, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(ft.group_advantages(rewards), advantage)
    z = ft.group_advantages(rewards, z_score=True)
    torch.testing.assert_close(z[0], advantage[0] / (rewards[0].std() + ft.STD_EPS))
    # the token-level normalisation is not GRPO's per-sample mean: with ragged lengths they differ
    per_sample = -((logp * advantage[..., None] * mask).sum(-1) / mask.sum(-1)).mean()
    assert not torch.isclose(ft.policy_gradient_loss(logp, rewards, mask), per_sample)


def test_token_logprobs_are_log_softmax_at_the_targets() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 7, (2, 3, 5), generator=g)
    got = ft.token_logprobs(logits, targets)
    for index in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(5)):
        i, j, t = index.tolist()
        row = logits[i, j, t]
        assert math.isclose(got[i, j, t], row[targets[i, j, t]] - math.log(row.exp().sum()), rel_tol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(clip=0.2), "old_logprobs and clip go together"),
        (dict(clip=1.5, old_logprobs=torch.zeros(3, 4, 6, dtype=torch.float64)), "clip must be"),
        (dict(kl_coef=0.1), "needs ref_logprobs"),
        (dict(kl_coef=-1.0), "kl_coef must be"),
        (dict(ref_logprobs=torch.zeros(3, 4), kl_coef=0.1), "ref_logprobs must have"),
    ],
)
def test_policy_gradient_loss_refuses_bad_switches(kwargs: dict, match: str) -> None:
    logp, rewards, mask, _, _ = rl_batch()
    with pytest.raises(ValueError, match=match):
        ft.policy_gradient_loss(logp, rewards, mask, **kwargs)


def test_policy_gradient_loss_refuses_bad_shapes() -> None:
    logp, rewards, mask, _, _ = rl_batch()
    with pytest.raises(ValueError, match="rewards must be a \\(P, G\\)"):
        ft.policy_gradient_loss(logp, rewards.flatten(), mask)
    with pytest.raises(ValueError, match="mask must be"):
        ft.policy_gradient_loss(logp, rewards, mask.double())
    with pytest.raises(ValueError, match="logprobs must be"):
        ft.policy_gradient_loss(logp[0], rewards, mask)
    with pytest.raises(ValueError, match="no True"):
        ft.policy_gradient_loss(logp, rewards, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="at least 2 samples"):
        ft.group_advantages(rewards[:, :1], z_score=True)


# ---------------------------------------------------------------- the rewards of 藏头诗

JINGYE = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"  # 霜 shuang, 乡 xiang: 唐
CHUNXIAO = "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"  # 鸟 niao, 少 shao: 豪
NO_RHYME = "春风吹柳绿，夏日照荷红。秋月明如水，冬雪白似银。"  # 红 hong (庚), 银 yin (文)


def test_rhyme_classes_follow_the_table() -> None:
    require(HAS_PYPINYIN, PYPINYIN_REASON)
    finals = [f for group in ft.RHYME_TABLE.values() for f in group]
    assert len(ft.RHYME_TABLE) == 14 and len(finals) == len(set(finals))  # each final in one class
    cases = {
        "麻": "麻家花", "波": "波歌多我", "皆": "学月雪", "开": "开怀", "微": "微回", "豪": "豪桥",
        "尤": "尤流", "寒": "寒天关全", "文": "文心春军", "唐": "唐香光", "庚": "庚星东穷",
        "齐": "齐衣儿雨居", "支": "支时子日", "姑": "姑湖",
    }  # fmt: skip
    for name, chars in cases.items():
        for char in chars:
            assert ft.rhyme_class(char) == name, char
    assert ft.rhyme_class("嗯") is None  # a final outside the table
    assert ft.rhyme_class("a") is None and ft.rhyme_class("，") is None  # not a Chinese character


def test_hand_made_poems_in_form_out_of_form() -> None:
    for poem in (JINGYE, CHUNXIAO, NO_RHYME):
        assert ft.in_form(poem)
    out = [
        JINGYE[:-1],  # the last mark missing
        JINGYE + "\n",  # a newline after it
        "床前明月光。疑是地上霜，举头望明月，低头思故乡。",  # the marks out of order
        "床前明月光光，疑是地上霜。举头望明月，低头思故乡。",  # six characters in line 1
        "床前明月光，疑是地上霜。举头望明月。",  # three lines
        "床前明月a，疑是地上霜。举头望明月，低头思故乡。",  # a Latin letter
        "床前明月，，疑是地上霜。举头望明月，低头思故乡。",  # a mark inside a line
        "",
    ]
    for poem in out:
        assert not ft.in_form(poem), poem


def test_hand_made_poems_acrostic_and_rhyme() -> None:
    require(HAS_PYPINYIN, PYPINYIN_REASON)
    assert ft.acrostic(NO_RHYME, "春夏秋冬") and ft.acrostic(CHUNXIAO, "春处夜花")
    assert not ft.acrostic(CHUNXIAO, "春夏秋冬") and not ft.acrostic(JINGYE[:-7], "床疑举低")
    assert ft.acrostic("春风，夏日长长。秋，冬雪。", "春夏秋冬")  # four lines begin as asked: form is another check
    assert ft.rhymes(JINGYE) and ft.rhymes(CHUNXIAO)
    assert not ft.rhymes(NO_RHYME)
    assert not ft.rhymes("春风吹柳绿，夏日照我时。秋月明如水，冬雪白似衣。")  # 时 (支) and 衣 (齐) differ
    assert ft.rhymes("春风吹柳绿，夏日照我衣。秋月明如水，冬雪落成泥。")  # 衣 yi, 泥 ni: 齐
    same = "春风吹柳绿，夏日照我衣。秋月明如水，冬雪白我衣。"
    assert ft.rhymes(same) and not ft.rhymes(same, distinct=True)  # 重韵
    assert ft.poem_checks(NO_RHYME, "春夏秋冬") == {"form": True, "acrostic": True, "rhyme": False, "all": False}
    assert ft.poem_checks(JINGYE, "床疑举低") == {"form": True, "acrostic": True, "rhyme": True, "all": True}
    assert ft.poem_reward(NO_RHYME, "春夏秋冬") == pytest.approx(2 / 3)
    assert ft.poem_reward(JINGYE, "床疑举低") == 1.0 and ft.poem_reward("", "床疑举低") == 0.0
    with pytest.raises(ValueError, match="heads must be four Chinese characters"):
        ft.acrostic(JINGYE, "床疑举")
    with pytest.raises(ValueError, match="heads"):
        ft.poem_reward(JINGYE, "abcd")


def test_corpus_rhyme_rate_is_the_documented_figure() -> None:
    """The share of the Tang corpus's five-character quatrains whose lines 2 and 4 rhyme under the table, as
    `corpus_rhyme_rate`'s docstring states it (77.7 %; the issue measured 75-83 % for such tables)."""
    require(HAS_PYPINYIN, PYPINYIN_REASON)
    from transformer_lab.data import load_corpus

    rhyming, quatrains = ft.corpus_rhyme_rate(load_corpus("tang"))
    assert (rhyming, quatrains) == (2868, 3692)
    assert f"{rhyming:,} of {quatrains:,} quatrains, {100 * rhyming / quatrains:.1f} %" in ft.corpus_rhyme_rate.__doc__


# ---------------------------------------------------------------- SFT data from the corpus


def test_quatrains_and_examples_of_a_poem() -> None:
    lushi = JINGYE + CHUNXIAO  # eight lines of five characters: two quatrains
    assert ft.quatrains_of(JINGYE) == [JINGYE] and ft.quatrains_of(lushi) == [JINGYE, CHUNXIAO]
    assert ft.quatrains_of("白日依山尽，黄河入海流。") == [] and ft.quatrains_of("床前明月光光，" * 4) == []
    acrostic, follow = ft.make_examples([JINGYE])
    assert (acrostic.kind, acrostic.argument, acrostic.prompt, acrostic.response) == (
        "acrostic", "床疑举低", "藏头床疑举低", JINGYE,
    )  # fmt: skip
    assert ft.acrostic(acrostic.response, acrostic.argument) and ft.poem_checks(JINGYE, "床疑举低")["all"]
    assert (follow.kind, follow.argument, follow.prompt) == ("continue", "床前明月光", "续写床前明月光")
    assert follow.response == "疑是地上霜。举头望明月，低头思故乡。"
    require(HAS_PYPINYIN, PYPINYIN_REASON)
    assert ft.continuation_checks(follow.argument, follow.response) == {"form": True, "rhyme": True, "new": True,
                                                                         "all": True}  # fmt: skip
    assert not ft.continuation_checks("床前明月光", "床前明月光。举头望明月，低头思故乡。")["all"]
    with pytest.raises(ValueError, match="kinds"):
        ft.make_examples([JINGYE], ["translate"])


def test_sft_splits_keep_held_out_poems_unseen() -> None:
    """A small corpus: the held-out side of pretraining's cut gives the test examples, except a quatrain that also
    stands in the pretraining text; no quatrain is in two splits."""
    poems = [JINGYE, CHUNXIAO + NO_RHYME, "白日依山尽，黄河入海流。", NO_RHYME.replace("春", "夏", 1)] * 5
    poems += [
        "千山鸟飞绝，万径人踪灭。孤舟蓑笠翁，独钓寒江雪。",
        JINGYE,
        "红豆生南国，春来发几枝。愿君多采撷，此物最相思。",
    ]
    text = "\n".join(poems) + "\n"
    seen, held_out = ft.pretraining_poems(text, 0.9)
    cut = int(len(text) * 0.9)
    assert all(p in text[:cut] for p in seen) and all(p in text[cut:] for p in held_out)
    assert len(seen) + len(held_out) in (len(poems), len(poems) - 1)
    splits = ft.sft_splits(text, validation=0.5)
    quatrains = {name: {e.poem for e in examples} for name, examples in splits.items()}
    assert quatrains["test"] and quatrains["train"] and quatrains["validation"]
    assert JINGYE not in quatrains["test"]  # held out, but also in the pretraining text
    assert all(q not in text[:cut] for q in quatrains["test"])
    assert not (quatrains["train"] & quatrains["validation"]) and not (quatrains["train"] & quatrains["test"])
    for examples in splits.values():
        assert {e.kind for e in examples} == {"acrostic", "continue"}


def test_rhyming_only_keeps_the_quatrains_that_rhyme_and_never_filters_test() -> None:
    """sft_splits(rhyming_only=True): the same split by poem, then train and validation keep only the examples
    whose quatrain rhymes on lines 2 and 4; test is the same list either way."""
    poems = [JINGYE, CHUNXIAO + NO_RHYME, "白日依山尽，黄河入海流。", NO_RHYME.replace("春", "夏", 1)] * 5
    poems += ["千山鸟飞绝，万径人踪灭。孤舟蓑笠翁，独钓寒江雪。", "秋山明月白，古寺落花红。野水孤舟去，寒云满树银。"]
    poems += ["红豆生南国，春来发几枝。愿君多采撷，此物最相思。"]  # the last two held out; 红 and 银 do not rhyme
    text = "\n".join(poems) + "\n"
    every, rhyming = ft.sft_splits(text, validation=0.5), ft.sft_splits(text, validation=0.5, rhyming_only=True)
    for part in ("train", "validation"):
        assert rhyming[part] == [e for e in every[part] if ft.rhymes(e.poem)]
        assert any(not ft.rhymes(e.poem) for e in every[part])  # something was filtered out
        assert rhyming[part] and all(ft.rhymes(e.poem) for e in rhyming[part])
    assert rhyming["test"] == every["test"] and any(not ft.rhymes(e.poem) for e in every["test"])
    with pytest.raises(ValueError, match="rhyming_only must be True or False"):
        ft.sft_splits(text, rhyming_only="yes")


def test_tang_rhyming_quatrains_are_the_recipes_data() -> None:
    """On the Tang corpus the recipe's SFT data (the quatrains that rhyme) are 44,094 of the 54,726 training
    examples; the share (80.6 %) is above the corpus-wide 77.7 % because eight-line poems give two halves."""
    from transformer_lab.data import load_corpus

    text = load_corpus("tang")
    every, rhyming = ft.sft_splits(text), ft.sft_splits(text, rhyming_only=True)
    assert (len(every["train"]), len(rhyming["train"])) == (54726, 44094)
    assert (len(every["validation"]), len(rhyming["validation"])) == (2774, 2250)
    assert rhyming["test"] == every["test"]


def test_heads_begun_says_which_lines_miss_their_head() -> None:
    """Line by line what `acrostic` asks of all four lines at once; a line that is not there misses."""
    assert ft.heads_begun(JINGYE, "床疑举低") == [True, True, True, True] and ft.acrostic(JINGYE, "床疑举低")
    assert ft.heads_begun(JINGYE, "床疑春低") == [True, True, False, True]
    assert ft.heads_begun(JINGYE[:12], "床疑举低") == [True, True, False, False]  # two lines only
    assert ft.heads_begun(None, "床疑举低") == [False] * 4
    with pytest.raises(ValueError, match="heads must be four Chinese characters"):
        ft.heads_begun(JINGYE, "床疑")


def test_held_out_heads_are_a_seeded_draw_of_the_test_splits_acrostic_heads() -> None:
    from transformer_lab.data import load_corpus

    splits = ft.sft_splits(load_corpus("tang"))
    heads = ft.held_out_heads(splits, 500)
    test = {e.argument for e in splits["test"] if e.kind == "acrostic"}
    assert len(heads) == 500 and set(heads) <= test and heads == ft.held_out_heads(splits, 500, seed=0)
    assert heads != ft.held_out_heads(splits, 500, seed=1)
    with pytest.raises(ValueError, match="count must be an int"):
        ft.held_out_heads(splits, 0)


def test_tang_held_out_poems_are_pretrainings_validation_split() -> None:
    """gpt_tang.pt was pretrained on the first 90 % of the corpus: 1,793 poems lie wholly after that cut, 391 of
    them quatrains; SFT's splits share no quatrain."""
    from transformer_lab.data import load_corpus

    text = load_corpus("tang")
    seen, held_out = ft.pretraining_poems(text)
    assert (len(seen), len(held_out), sum(map(ft.in_form, held_out))) == (16039, 1793, 391)
    splits = ft.sft_splits(text)
    quatrains = {name: {e.poem for e in examples} for name, examples in splits.items()}
    assert not (quatrains["train"] & quatrains["test"]) and not (quatrains["validation"] & quatrains["test"])
    assert not (quatrains["train"] & quatrains["validation"])
    assert len(splits["test"]) > 2 * 500  # the 500 held-out prompts of the benchmarks, each kind


# ---------------------------------------------------------------- sampling groups


def small_sft_model():  # noqa: ANN201 - (GPT, TextTokenizer, SFTFormat)
    from transformer_lab.data import TextTokenizer
    from transformer_lab.gpt import GPT, GPTConfig

    tokenizer = TextTokenizer("，。山水风月花")
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=20, d_model=16, n_heads=2, n_layers=2))
    model = ft.add_special_tokens(base.double(), 3)
    with torch.no_grad():  # the end token likelier, so that some responses end early
        model.token_embedding.weight[-1] += 0.5 * torch.randn(16, dtype=torch.float64)
    return model.eval(), tokenizer, ft.SFTFormat(base_vocab=tokenizer.vocab_size)


def test_sample_groups_is_one_cached_batch_and_masks_after_the_end() -> None:
    model, tokenizer, fmt = small_sft_model()
    prompts = ["山水", "风月"]
    rollout = ft.sample_groups(model, fmt, tokenizer, prompts, 4, 10, generator=torch.Generator().manual_seed(2))
    assert rollout.tokens.shape == (2, 4, 14) and rollout.mask.shape == (2, 4, 10) and rollout.prompt_length == 4
    idx = torch.tensor([fmt.prompt_ids(tokenizer, p) for p in prompts]).repeat_interleave(4, 0)
    expected = model.generate(idx, 10, generator=torch.Generator().manual_seed(2))  # the same draws
    assert torch.equal(rollout.tokens.reshape(8, 14), expected)
    ended = 0
    for p in range(2):
        for g in range(4):
            new = rollout.tokens[p, g, 4:].tolist()
            stop = new.index(fmt.end_id) + 1 if fmt.end_id in new else len(new)
            ended += stop < len(new)
            assert rollout.mask[p, g].tolist() == [t < stop for t in range(10)]
            kept = [t for t in new[:stop] if t != fmt.end_id]
            text = rollout.texts[p][g]
            if all(t < fmt.base_vocab for t in kept):
                assert text == tokenizer.decode(kept)
            else:
                assert text is None
    assert 0 < ended < 8  # some end early, some run to the last step


def test_response_logprobs_equal_step_by_step_ones() -> None:
    model, tokenizer, fmt = small_sft_model()
    rollout = ft.sample_groups(model, fmt, tokenizer, ["山水"], 3, 8, generator=torch.Generator().manual_seed(5))
    got = ft.response_logprobs(model, rollout)
    assert got.shape == (1, 3, 8) and got.requires_grad
    for g in range(3):
        row = rollout.tokens[0, g]
        for t in range(8):
            with torch.no_grad():
                logits = model(row[None, : 4 + t])[0, -1]
            expected = logits.log_softmax(-1)[row[4 + t]]
            torch.testing.assert_close(got[0, g, t].detach(), expected, rtol=1e-10, atol=1e-10)


def test_sample_groups_refuses_bad_input() -> None:
    model, tokenizer, fmt = small_sft_model()
    with pytest.raises(ValueError, match="one length"):
        ft.sample_groups(model, fmt, tokenizer, ["山", "山水"], 2, 5)
    with pytest.raises(ValueError, match="block_size"):
        ft.sample_groups(model, fmt, tokenizer, ["山水"], 2, 17)
    with pytest.raises(ValueError, match="group_size"):
        ft.sample_groups(model, fmt, tokenizer, ["山水"], 0, 5)


# ---------------------------------------------------------------- checkpoints carry the format


def test_save_and_load_sft_round_trip_with_lora_merged(tmp_path) -> None:  # noqa: ANN001
    model, tokenizer, fmt = small_sft_model()
    model = model.float()
    ft.apply_lora(model, ["w_q", "w_v"], rank=2, alpha=4)
    with torch.no_grad():
        for module in ft.lora_modules(model).values():
            module.lora_B.normal_()
    idx = torch.tensor([fmt.prompt_ids(tokenizer, "山水")])
    with torch.no_grad():
        expected = model(idx)
    path = tmp_path / "sft.pt"
    ft.save_sft(model, path, tokenizer, fmt, options={"steps": 3})
    assert ft.lora_modules(model)  # the model saved is left as it was
    loaded, loaded_tokenizer, loaded_fmt = ft.load_sft(path)
    assert loaded_fmt == fmt and loaded_tokenizer.chars == tokenizer.chars and not ft.lora_modules(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), expected, rtol=1e-5, atol=1e-5)
    raw = torch.load(path, weights_only=True)
    assert raw["kind"] == "gpt_sft" and raw["sft_format"] == fmt.to_dict() and raw["options"] == {"steps": 3}
    ft.save_sft(loaded, tmp_path / "half.pt", tokenizer, fmt, half=True)
    assert torch.load(tmp_path / "half.pt", weights_only=True)["state_dict"]["lm_head.weight"].dtype == torch.float16


def test_checkpoints_and_sampling_refuse_a_missing_or_mismatched_format(tmp_path) -> None:  # noqa: ANN001
    from transformer_lab.data import ASSETS, TextTokenizer

    with pytest.raises(ValueError, match="without a prompt/response format"):
        ft.load_sft(ASSETS / "gpt_tang.pt")
    model, tokenizer, fmt = small_sft_model()
    other = ft.SFTFormat(base_vocab=tokenizer.vocab_size + 1)
    with pytest.raises(ValueError, match="use the format saved with the model"):
        ft.sample_groups(model, other, tokenizer, ["山水"], 2, 5)
    with pytest.raises(ValueError, match="use the format saved with the model"):
        ft.save_sft(model, tmp_path / "x.pt", tokenizer, other)
    with pytest.raises(ValueError, match="base model's"):
        ft.save_sft(model, tmp_path / "x.pt", TextTokenizer("山水"), fmt)
    with pytest.raises(ValueError, match="may not be called"):
        ft.save_sft(model, tmp_path / "x.pt", tokenizer, fmt, sft_format={})
    with pytest.raises(TypeError, match="weights_only"):
        ft.save_sft(model, tmp_path / "x.pt", tokenizer, fmt, options={"fmt": fmt})
    ft.save_sft(model, tmp_path / "good.pt", tokenizer, fmt)
    data = torch.load(tmp_path / "good.pt", weights_only=True)
    data["sft_format"]["base_vocab"] += 1
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="made for 8 base tokens, the tokenizer has 7"):
        ft.load_sft(tmp_path / "bad.pt")
    with pytest.raises(FileNotFoundError):
        ft.load_sft(tmp_path / "none.pt")


def test_save_and_load_lora_on_its_base_only(tmp_path) -> None:  # noqa: ANN001
    import copy

    model, tokenizer, fmt = small_sft_model()
    base = copy.deepcopy(model)
    ft.apply_lora(model, ["w_q", "feed_forward.w2"], rank=3, alpha=5)
    with torch.no_grad():
        for module in ft.lora_modules(model).values():
            module.lora_B.normal_()
    assert ft.base_fingerprint(model) == ft.base_fingerprint(base)  # LoRA layers count as their base
    idx = torch.tensor([fmt.prompt_ids(tokenizer, "山水")])
    with torch.no_grad():
        expected = model(idx)
    ft.save_lora(model, tmp_path / "lora.pt", steps=10)
    raw = torch.load(tmp_path / "lora.pt", weights_only=True)
    assert sorted(raw["layers"]) == sorted(ft.lora_modules(model)) and raw["steps"] == 10
    assert not any("token_embedding" in k for k in raw["layers"])  # A and B only
    restored = ft.load_lora(copy.deepcopy(base), tmp_path / "lora.pt")
    with torch.no_grad():
        torch.testing.assert_close(restored(idx), expected, rtol=1e-12, atol=1e-12)
    assert len(ft.lora_parameters(restored)) == 8 and all(p.requires_grad for p in ft.lora_parameters(restored))
    other = copy.deepcopy(base)
    with torch.no_grad():
        other.layers[0].norm1.weight[0] += 1e-3
    with pytest.raises(ValueError, match="trained on another base model"):
        ft.load_lora(other, tmp_path / "lora.pt")
    with pytest.raises(TypeError, match="holds only A and B"):
        ft.load_lora(tmp_path / "lora.pt", tmp_path / "lora.pt")
    ft.save_sft(base, tmp_path / "sft.pt", tokenizer, fmt)
    with pytest.raises(ValueError, match="not a LoRA checkpoint"):
        ft.load_lora(copy.deepcopy(base), tmp_path / "sft.pt")
    ft.merge_lora(model)
    with pytest.raises(ValueError, match="merged"):
        ft.save_lora(model, tmp_path / "merged.pt")


# ---------------------------------------------------------------- the benchmarks' measures


def test_poem_rates_and_diversity_on_hand_made_samples() -> None:
    require(HAS_PYPINYIN, PYPINYIN_REASON)
    texts = [JINGYE, NO_RHYME, None, "床前明月光"]
    heads = ["床疑举低", "春夏秋冬", "春夏秋冬", "床疑举低"]
    assert ft.poem_rates(texts, heads) == {"form": 0.5, "acrostic": 0.5, "rhyme": 0.25, "all": 0.25}
    training = {"床前明月光", "疑是地上霜"}
    measured = ft.diversity([JINGYE, JINGYE, NO_RHYME, None], training)
    # lines: 4 of JINGYE twice and 4 of NO_RHYME: 8 distinct of 12; copied: 2 lines x 2 of 12; ends: 乡 霜 红 银
    assert measured["distinct"] == pytest.approx(8 / 12) and measured["copied"] == pytest.approx(4 / 12)
    assert measured["last_chars"] == pytest.approx(4 / 6)
    assert math.isnan(ft.diversity([None], training)["distinct"])
    with pytest.raises(ValueError, match="one length"):
        ft.poem_rates(texts, heads[:2])


# ---------------------------------------------------------------- constrained decoding


def forced_reference(model, idx, heads, tokenizer, steps):  # noqa: ANN001, ANN201
    """Greedy decoding without a cache, the whole context run every step, written as the rule says: the first
    token and each token after a mark is the next head while heads remain."""
    out = []
    for row, head in zip(idx, heads, strict=True):
        tokens, placed, start = row.tolist(), 0, True
        for _ in range(steps):
            with torch.no_grad():
                choice = int(model(torch.tensor([tokens]))[0, -1].argmax())
            if start and placed < 4:
                choice, placed = tokenizer.encode(head[placed]).item(), placed + 1
            start = choice in tokenizer.encode("，。").tolist()
            tokens.append(choice)
        out.append(tokens)
    return torch.tensor(out)


def test_forced_heads_equal_a_plain_reference_and_make_every_sample_acrostic() -> None:
    model, tokenizer, fmt = small_sft_model()
    base = tokenizer.vocab_size
    idx = torch.tensor([fmt.prompt_ids(tokenizer, "山水"), fmt.prompt_ids(tokenizer, "风月")])
    heads = ["山水风月", "花月山水"]
    greedy = ft.generate_forced_heads(model, idx, heads, tokenizer, 16, temperature=0)
    assert torch.equal(greedy, forced_reference(model, idx, heads, tokenizer, 16))
    # sampling: wherever a sample has lines, they begin with the heads (markers read as text boundaries)
    sampled = ft.generate_forced_heads(
        model, idx.repeat(8, 1), heads * 8, tokenizer, 16, generator=torch.Generator().manual_seed(0)
    )
    most = 0
    for row, head in zip(sampled[:, 4:].tolist(), heads * 8, strict=True):
        text = "".join(tokenizer.decode([t]) if t < base else "|" for t in row)
        lines = ft.poem_lines(text)
        assert all(line.startswith(h) for line, h in zip(lines, head, strict=False))  # up to 4 lines
        most = max(most, len(lines))
    assert most >= 4  # some samples reach the fourth line: every forcing is exercised
    with pytest.raises(ValueError, match="block_size"):
        ft.generate_forced_heads(model, idx, heads, tokenizer, 17)
    with pytest.raises(ValueError, match="heads must be four"):
        ft.generate_forced_heads(model, idx, ["山水", "风月"], tokenizer, 5)


# ---------------------------------------------------------------- the training loops


def tiny_poem_model(block: int = 40):  # noqa: ANN201 - (GPT, TextTokenizer, SFTFormat)
    from transformer_lab.data import TextTokenizer
    from transformer_lab.gpt import GPT, GPTConfig

    tokenizer = TextTokenizer("，。\n藏头续写山水风月花春夏秋冬云雨")
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block, d_model=16, n_heads=2, n_layers=2))
    return ft.add_special_tokens(base, 3), tokenizer, ft.SFTFormat(base_vocab=tokenizer.vocab_size)


POEM = "春山水风月，夏花云雨山。秋水风月花，冬云雨山水。"


def test_sft_lowers_the_loss_and_leaves_the_model_in_eval_mode() -> None:
    model, tokenizer, fmt = tiny_poem_model()
    data = ft.encode_examples([("藏头春夏秋冬", POEM), ("续写春山水风月", POEM[6:])], fmt, tokenizer)
    before = ft.sft_validation_loss(model, data)
    history = ft.sft(
        model,
        data,
        data,
        steps=40,
        batch_size=4,
        lr=1e-2,
        warmup=2,
        eval_every=20,
        evaluate=lambda m, step: (step, m.training),
    )
    assert history["eval_step"] == [20, 40] and len(history["loss"]) == 40
    assert history["eval"] == [(20, False), (40, False)]  # called at each validation step, in eval mode
    assert history["val_loss"][-1] < 0.5 * before
    assert not model.training
    assert history["seconds"][0] > 0


def test_fine_tune_grows_the_base_and_is_the_steps_it_names() -> None:
    """ft.fine_tune (what the CLI and the benchmark run) equals add_special_tokens, apply_lora and sft by hand."""
    from transformer_lab.data import TextTokenizer
    from transformer_lab.gpt import GPT, GPTConfig

    tokenizer = TextTokenizer("，。\n藏头续写山水风月花春夏秋冬云雨")
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=40, d_model=16, n_heads=2, n_layers=2))
    fmt = ft.SFTFormat(base_vocab=tokenizer.vocab_size)
    data = ft.encode_examples([("藏头春夏秋冬", POEM)], fmt, tokenizer)
    options = dict(steps=4, batch_size=2, lr=1e-2, warmup=1)
    for rank in (0, 2):
        model, history = ft.fine_tune(base, data, data, seed=3, lora_rank=rank, lora_targets=["w_q", "w1"], **options)
        torch.manual_seed(3)
        by_hand = ft.add_special_tokens(base)
        if rank:
            ft.apply_lora(by_hand, ["w_q", "w1"], rank=rank, alpha=2.0 * rank)
        expected = ft.sft(by_hand, data, data, seed=3, new_rows=3 if rank else 0, **options)
        assert model.config.vocab_size == tokenizer.vocab_size + 3 and history["loss"] == expected["loss"]
        ours, theirs = model.state_dict(), by_hand.state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        assert bool(ft.lora_modules(model)) == bool(rank)


def test_sft_with_lora_trains_only_a_b_and_the_new_rows() -> None:
    model, tokenizer, fmt = tiny_poem_model()
    ft.apply_lora(model, ["w_q", "w_v", "w1"], rank=2, alpha=4.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = ft.encode_examples([("藏头春夏秋冬", POEM)], fmt, tokenizer)
    ft.sft(model, data, steps=5, batch_size=2, lr=1e-2, warmup=1, new_rows=3)
    for name, p in model.named_parameters():
        if "lora_" in name:
            assert name.endswith("lora_A") or not torch.equal(p, before[name]), name  # B leaves zero
        elif name == "token_embedding.weight":
            assert torch.equal(p[:-3], before[name][:-3]) and not torch.equal(p[-3:], before[name][-3:])
        else:
            assert torch.equal(p, before[name]), name
    assert not model.token_embedding.weight.requires_grad  # frozen again after the run
    with pytest.raises(ValueError, match="weight_decay=0"):
        ft.sft(model, data, steps=1, new_rows=3, weight_decay=0.1)


def test_sft_gradient_is_zero_at_prompt_positions() -> None:
    model, tokenizer, fmt = tiny_poem_model()
    inputs, targets, mask = ft.encode_examples([("藏头春夏秋冬", POEM)], fmt, tokenizer)
    hidden = model.token_embedding(inputs).detach().requires_grad_(True)
    logits = model.lm_head(hidden)  # a per-position head: position t's gradient comes from position t's loss
    ft.response_loss(logits, targets, mask).backward()
    assert hidden.grad[~mask].abs().max() == 0 and hidden.grad[mask].abs().max() > 0


def lora_trained_with_new_rows():  # noqa: ANN201 - (base, model with LoRA, encoded data)
    """A tiny poem model and a copy of it with LoRA on w_q and w1, trained 3 steps with the 3 added rows."""
    model, tokenizer, fmt = tiny_poem_model()
    base = copy.deepcopy(model)
    ft.apply_lora(model, ["w_q", "w1"], rank=2, alpha=4.0)
    data = ft.encode_examples([("藏头春夏秋冬", POEM)], fmt, tokenizer)
    ft.sft(model, data, steps=3, batch_size=2, lr=1e-2, warmup=1, new_rows=3)
    return base, model, data


def test_lora_adapter_with_new_rows_round_trips(tmp_path) -> None:  # noqa: ANN001
    base, model, data = lora_trained_with_new_rows()
    ft.save_lora(model, tmp_path / "a.pt", new_rows=3)
    loaded = ft.load_lora(copy.deepcopy(base), tmp_path / "a.pt")
    x = data[0]
    torch.testing.assert_close(loaded.eval()(x), model.eval()(x))
    with pytest.raises(ValueError, match="another base"):
        other = copy.deepcopy(base)
        with torch.no_grad():
            other.layers[0].self_attn.w_o.weight[0, 0] += 1
        ft.load_lora(other, tmp_path / "a.pt")
    ft.save_lora(model, tmp_path / "b.pt")  # without the rows the fingerprint covers them: trained rows differ
    with pytest.raises(ValueError, match="another base"):
        ft.load_lora(copy.deepcopy(base), tmp_path / "b.pt")


def test_lora_adapter_in_float16_loads_as_float32(tmp_path) -> None:  # noqa: ANN001
    base, model, _ = lora_trained_with_new_rows()
    ft.save_lora(model, tmp_path / "half.pt", new_rows=3, half=True)
    raw = torch.load(tmp_path / "half.pt", weights_only=True)
    stored = [t for layer in raw["layers"].values() for t in (layer["A"], layer["B"])] + [raw["token_rows"]]
    assert {t.dtype for t in stored} == {torch.float16}
    loaded = ft.load_lora(copy.deepcopy(base), tmp_path / "half.pt")
    for name, module in ft.lora_modules(loaded).items():
        mine = ft.lora_modules(model)[name]
        assert module.lora_A.dtype == torch.float32
        assert torch.equal(module.lora_A, mine.lora_A.detach().half().float())
        assert torch.equal(module.lora_B, mine.lora_B.detach().half().float())
    assert torch.equal(loaded.token_embedding.weight[-3:], model.token_embedding.weight[-3:].detach().half().float())
    with pytest.raises(TypeError, match="half must be True or False"):
        ft.save_lora(model, tmp_path / "x.pt", half=1)


def test_load_lora_refuses_unreadable_and_incomplete_files_in_one_sentence(tmp_path) -> None:  # noqa: ANN001
    model, _, _ = tiny_poem_model()
    (tmp_path / "text.pt").write_text("not a checkpoint", encoding="utf-8")
    with pytest.raises(ValueError, match="LoRA checkpoint"):
        ft.load_lora(copy.deepcopy(model), tmp_path / "text.pt")
    with pytest.raises(FileNotFoundError, match="no LoRA checkpoint"):
        ft.load_lora(copy.deepcopy(model), tmp_path / "none.pt")
    with pytest.raises(ValueError, match="is a folder"):
        ft.load_lora(copy.deepcopy(model), tmp_path)
    torch.save({"kind": ft.LORA_KIND}, tmp_path / "empty.pt")
    with pytest.raises(ValueError, match="not a complete LoRA checkpoint"):
        ft.load_lora(copy.deepcopy(model), tmp_path / "empty.pt")
    torch.save({"kind": ft.LORA_KIND, "base_fingerprint": "0", "layers": {"w_q": {"rank": 2}}}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="not a complete LoRA checkpoint"):
        ft.load_lora(copy.deepcopy(model), tmp_path / "bad.pt")


def test_rl_raises_a_simple_reward() -> None:
    model, tokenizer, fmt = tiny_poem_model()

    def reward(text, heads):  # noqa: ANN001, ANN202 - the share of 山 in the text
        return 0.0 if not text else text.count("山") / len(text)

    heads = ["春夏秋冬", "山水风月"]
    rates = []

    def measure(m):  # noqa: ANN001, ANN202
        texts = [t for group in ft.sample_poems(m, fmt, tokenizer, heads * 20, seed=1) for t in group]
        return {"reward": sum(reward(t, None) for t in texts) / len(texts)}

    history = ft.rl(
        model,
        fmt,
        tokenizer,
        heads,
        reward,
        steps=30,
        prompts_per_step=4,
        group_size=8,
        lr=3e-2,
        evaluate=measure,
        eval_every=30,
        seed=0,
    )
    assert history["eval_step"] == [0, 30] and len(history["reward"]) == 30
    rates = [e["reward"] for e in history["eval"]]
    assert rates[1] > rates[0] + 0.2, rates


def test_rl_refuses_bad_settings() -> None:
    model, tokenizer, fmt = tiny_poem_model()
    with pytest.raises(TypeError, match="reward"):
        ft.rl(model, fmt, tokenizer, ["春夏秋冬"], "poem")
    with pytest.raises(ValueError, match="reference"):
        ft.rl(model, fmt, tokenizer, ["春夏秋冬"], ft.poem_reward, kl_coef=0.1)
    with pytest.raises(ValueError, match="steps"):
        ft.rl(model, fmt, tokenizer, ["春夏秋冬"], ft.poem_reward, steps=0)


def test_rejection_sample_keeps_only_poems_that_pass_every_check(monkeypatch) -> None:  # noqa: ANN001
    good = "春来山水好，夏日听风声。秋月何时了，冬云满旧城。"  # 声 / 城: both 庚
    same = "春来山水好，夏日满旧城。秋月何时了，冬云满旧城。"  # one character twice: 重韵
    bad = "春来山水好，夏日满旧城。秋月何时了，冬云满旧山。"  # 城 / 山: no rhyme
    monkeypatch.setattr(ft, "sample_poems", lambda *a, **k: [[good, same, bad, None, good]])
    pairs = ft.rejection_sample(None, None, None, ["春夏秋冬"], samples=5, keep_per_prompt=3)
    assert pairs == [("藏头春夏秋冬", good)]


def test_poem_reward_and_rhyme_reward() -> None:
    good = "春来山水好，夏日听风声。秋月何时了，冬云满旧城。"
    same = "春来山水好，夏日满旧城。秋月何时了，冬云满旧城。"
    assert ft.poem_reward(good, "春夏秋冬", True) == 1.0
    assert ft.poem_reward(same, "春夏秋冬") == 1.0 and ft.poem_reward(same, "春夏秋冬", True) == pytest.approx(2 / 3)
    assert ft.poem_reward(None, "春夏秋冬") == 0.0 and ft.rhyme_reward(None, "春夏秋冬") == 0.0
    assert ft.rhyme_reward(same, "春夏秋冬") == 1.0 and ft.rhyme_reward("山，水。", "春夏秋冬") == 0.0


def test_evaluate_poems_rates_are_those_of_its_samples() -> None:
    model, tokenizer, fmt = tiny_poem_model()
    heads = ["春夏秋冬", "山水风月", "云雨花春"]
    result = ft.evaluate_poems(model, fmt, tokenizer, heads, {"春山水风月"}, seed=3)
    texts = result.pop("texts")
    assert texts == [g[0] for g in ft.sample_poems(model, fmt, tokenizer, heads, seed=3)]
    expected = {**ft.poem_rates(texts, heads), **ft.diversity(texts, {"春山水风月"})}
    assert result.keys() == expected.keys()
    for key, value in expected.items():
        assert result[key] == value or (math.isnan(value) and math.isnan(result[key]))


def test_common_heads_are_four_different_common_line_initials() -> None:
    poems = ["春山水风月，夏花云雨山。秋水风月花，冬云雨山水。", "春水，夏山。"]
    heads = ft.common_heads(poems, 20, seed=1, top=4)
    assert len(heads) == 20 and all(len(set(h)) == 4 and set(h) == set("春夏秋冬") for h in heads)
    assert heads == ft.common_heads(poems, 20, seed=1, top=4)


# ---------------------------------------------------------------- the shipped models of chapter 13


def test_shipped_models_load_with_their_format_in_float16_under_8_mb() -> None:
    import json
    from pathlib import Path

    from transformer_lab.gpt_training import load_gpt

    assets = Path(ft.__file__).resolve().parent / "assets"
    for name in ("finetune_sft.pt", "finetune_rl.pt", "finetune_lora.pt"):
        assert (assets / name).stat().st_size <= 8 * 2**20, name
    for name in ("finetune_sft.pt", "finetune_rl.pt"):
        raw = torch.load(assets / name, weights_only=True)
        assert {v.dtype for v in raw["state_dict"].values() if v.is_floating_point()} == {torch.float16}
        model, tokenizer, fmt = ft.load_sft(assets / name)
        assert fmt.base_vocab == tokenizer.vocab_size == model.config.vocab_size - 3
    adapter = torch.load(assets / "finetune_lora.pt", weights_only=True)
    stored = [t for layer in adapter["layers"].values() for t in (layer["A"], layer["B"])] + [adapter["token_rows"]]
    assert {t.dtype for t in stored} == {torch.float16}
    base, _ = load_gpt(assets / "gpt_tang.pt")
    model = ft.load_lora(ft.add_special_tokens(base), assets / "finetune_lora.pt")  # its base's fingerprint
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    trainable = sum(p.numel() for p in ft.lora_parameters(model)) + 3 * model.config.d_model
    log = json.loads((assets / "finetune_log.json").read_text("utf-8"))
    assert log["summary"]["d_lora"]["trainable"] == trainable
    assert trainable < 0.1 * sum(p.numel() for p in base.parameters())  # the bound for LoRA
    assert log["summary"]["c_sft"]["trainable"] == sum(p.numel() for p in ft.add_special_tokens(base).parameters())
    assert {r["stage"] for r in log["runs"]} == set(log["summary"])
    for stage, entry in log["summary"].items():  # each stage's seeds (some stages ran fewer), seed 0's shipped
        assert entry["seeds"] == sorted(r["seed"] for r in log["runs"] if r["stage"] == stage) and 0 in entry["seeds"]


def test_four_lines_keeps_a_base_models_answer_up_to_the_fourth_line_or_the_newline() -> None:
    assert ft.four_lines(POEM + POEM) == POEM  # an eight-line poem: the first four lines
    assert ft.four_lines(POEM[:12] + "\n" + POEM) == POEM[:12]  # a newline first: up to it
    assert ft.four_lines(POEM[:15]) == POEM[:15]  # no second "。": the whole text
    assert ft.four_lines("") == ""
