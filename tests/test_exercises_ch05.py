"""Chapter 05's exercises: each reference agrees with the library and with PyTorch's own modules."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lab as tl
from transformer_lab import diagnostics
from transformer_lab.exercises import ch05_feed_forward as ex


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_predicted_parameter_count_is_the_modules() -> None:
    answer = ex.predict_ffn_parameters.reference()
    assert answer == _n_params(tl.FeedForward(512, 2048))
    theirs = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    assert answer == _n_params(theirs.linear1) + _n_params(theirs.linear2)
    assert answer not in ex.predict_ffn_parameters.explain


@pytest.mark.parametrize("dim", [1, 3, 8, 64])
def test_layer_ffn_reference_equals_pytorchs_ffn(dim: int) -> None:
    args = SimpleNamespace(dim=dim, n_embd=dim, n_heads=1, n_layer=1, dropout=0.1)
    torch.manual_seed(dim)
    ours = ex._layer_ffn_reference(args).double().eval()
    first, second = ours[0], ours[2]
    assert (first.in_features, first.out_features, second.out_features) == (dim, 4 * dim, dim)
    theirs = nn.TransformerEncoderLayer(dim, 1, 4 * dim, dropout=0.0, batch_first=True).double().eval()
    library = tl.FeedForward(dim, 4 * dim).double().eval()
    with torch.no_grad():
        for linear, ours_linear in ((theirs.linear1, first), (theirs.linear2, second)):
            linear.weight.copy_(ours_linear.weight)
            linear.bias.zero_()  # note 000's MLP has no biases
        library.w1.weight.copy_(first.weight)
        library.w2.weight.copy_(second.weight)
        library.w1.bias.zero_()
        library.w2.bias.zero_()
        x = torch.randn(2, 5, dim, dtype=torch.float64)
        expected = theirs.linear2(theirs.dropout(theirs.activation(theirs.linear1(x))))
        torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(library(x), expected, rtol=0, atol=1e-10)


def test_notes_layer_ffn_is_a_quarter_of_the_fixed_one() -> None:
    args = SimpleNamespace(dim=512, n_embd=512, n_heads=8, n_layer=6, dropout=0.1)
    notes, fixed = ex.notes_layer_ffn(args), ex._layer_ffn_reference(args)
    assert notes[0].out_features == 512 and fixed[0].out_features == 2048
    assert 4 * _n_params(notes) == _n_params(fixed) == 2 * 512 * 2048
    x = torch.randn(2, 3, 512)
    assert notes.eval()(x).shape == fixed.eval()(x).shape == x.shape  # the shapes fit either way


class _SwappedOrder(nn.Module):
    """The right FFN with its layers registered in another order and under other names."""

    def __init__(self, args: SimpleNamespace) -> None:
        super().__init__()
        self.down = nn.Linear(4 * args.dim, args.dim, bias=False)
        self.up = nn.Linear(args.dim, 4 * args.dim, bias=False)
        self.drop = nn.Dropout(args.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(torch.relu(self.up(x))))


def test_layer_ffn_check_accepts_any_layout_of_the_right_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert ex.layer_ffn.passes(_SwappedOrder)
    assert not ex.layer_ffn.passes(lambda args: nn.Identity())  # no parameters at all
    ex.layer_ffn.check(lambda args: torch.zeros(3))
    assert "should return an nn.Module" in capsys.readouterr().out


def _stack_and_blocks(n_layers: int, residual: bool, seed: int) -> tuple[diagnostics.FeedForwardStack, list[nn.Module]]:
    torch.manual_seed(seed)
    stack = diagnostics.FeedForwardStack(6, 24, n_layers, residual).double()
    blocks = [nn.Sequential(norm, ffn) for norm, ffn in zip(stack.norms, stack.layers, strict=True)]
    return stack, blocks


@pytest.mark.parametrize("residual", [True, False])
def test_gradient_norms_reference_equals_autograd_and_the_library(residual: bool) -> None:
    stack, blocks = _stack_and_blocks(5, residual, 0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)
    target = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)
    got = ex._gradient_norms_reference(blocks, x, target, residual)
    grads = torch.autograd.grad(F.mse_loss(stack(x), target), list(stack.parameters()))
    by_param = {id(p): grad for p, grad in zip(stack.parameters(), grads, strict=True)}
    expected = [math.sqrt(sum(float(by_param[id(p)].pow(2).sum()) for p in block.parameters())) for block in blocks]
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert got == pytest.approx(diagnostics.gradient_norms(blocks), rel=1e-12)  # the grads the reference left behind


def test_gradient_norms_without_residual_shrink_towards_the_input() -> None:
    with torch.enable_grad():
        without = ex._gradient_norms_reference(*ex._stack_case(8, 6, (2, 4), False, 1))
        with_residual = ex._gradient_norms_reference(*ex._stack_case(8, 6, (2, 4), True, 1))
    assert without[0] < 0.1 * without[-1]
    assert with_residual[0] > 0.5 * with_residual[-1]


@pytest.mark.parametrize("case", range(4))
def test_swiglu_reference_equals_a_module_with_torchs_silu(case: int) -> None:
    x, w1, w3, w2 = (t.double() for t in ex.swiglu_feed_forward.cases[case].inputs())
    hidden, d_model = w1.shape
    layers = {
        name: nn.Linear(*size, bias=False).double()
        for name, size in (("w1", (d_model, hidden)), ("w3", (d_model, hidden)), ("w2", (hidden, d_model)))
    }
    with torch.no_grad():
        for name, weight in (("w1", w1), ("w3", w3), ("w2", w2)):
            layers[name].weight.copy_(weight)
        expected = layers["w2"](F.silu(layers["w1"](x)) * layers["w3"](x))
    torch.testing.assert_close(ex._swiglu_reference(x, w1, w3, w2), expected, rtol=0, atol=1e-10)


def test_swiglu_width_matches_the_relu_ffn_exactly() -> None:
    width = ex.predict_swiglu_width.reference()
    swiglu = nn.ModuleList(
        [nn.Linear(512, width, bias=False), nn.Linear(512, width, bias=False), nn.Linear(width, 512, bias=False)]
    )
    assert _n_params(swiglu) == _n_params(tl.FeedForward(512, 2048))
    assert width not in ex.predict_swiglu_width.explain


# --- right answers in other styles than the reference's: each must pass ----------------------------------------


def _ffn_own_module(args):  # noqa: ANN001, ANN202
    class MLP(nn.Module):
        def __init__(self, dim: int, hidden: int, p: float) -> None:
            super().__init__()
            self.w1, self.w2 = nn.Linear(dim, hidden, bias=False), nn.Linear(hidden, dim, bias=False)
            self.dropout = nn.Dropout(p)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.w2(F.relu(self.w1(x))))

    return MLP(args.dim, 4 * args.dim, args.dropout)


def _forward(blocks, x, residual):  # noqa: ANN001, ANN202
    h = x
    for block in blocks:
        h = h + block(h) if residual else block(h)
    return h


def _norms_autograd_grad(blocks, x, target, residual):  # noqa: ANN001, ANN202
    loss = ((_forward(blocks, x, residual) - target) ** 2).mean()
    params = [list(block.parameters()) for block in blocks]
    grads = torch.autograd.grad(loss, [p for ps in params for p in ps])
    out, i = [], 0
    for ps in params:
        out.append(float(torch.cat([g.flatten() for g in grads[i : i + len(ps)]]).norm()))
        i += len(ps)
    return out


def _norms_as_tensor(blocks, x, target, residual):  # noqa: ANN001, ANN202
    F.mse_loss(_forward(blocks, x, residual), target).backward()
    return torch.stack([torch.cat([p.grad.flatten() for p in block.parameters()]).norm() for block in blocks])


def _norms_as_tuple(blocks, x, target, residual):  # noqa: ANN001, ANN202
    F.mse_loss(_forward(blocks, x, residual), target).backward()
    return tuple(math.sqrt(sum(float((p.grad**2).sum()) for p in block.parameters())) for block in blocks)


def test_right_answers_in_other_styles_pass() -> None:
    answers = {
        ex.layer_ffn: [_ffn_own_module],
        ex.block_gradient_norms: [_norms_autograd_grad, _norms_as_tensor, _norms_as_tuple],
        ex.swiglu_feed_forward: [
            lambda x, w1, w3, w2: F.linear((a := F.linear(x, w1)) / (1 + torch.exp(-a)) * F.linear(x, w3), w2),
            lambda x, w1, w3, w2: torch.einsum(
                "...h,dh->...d",
                (a := torch.einsum("...d,hd->...h", x, w1)) * torch.sigmoid(a) * torch.einsum("...d,hd->...h", x, w3),
                w2,
            ),
        ],
        ex.predict_swiglu_width: [lambda: 1367.0],
    }
    for exercise, candidates in answers.items():
        for candidate in candidates:
            result = exercise.run(candidate)
            assert result.passed, result.report()
