"""layers.mlp: ReluMLP's backward gives autograd's gradients and runs only where it is meant to; mlp_over_columns
is the MLP of the transpose."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layers.mlp import relu_mlp


def _plain(x, up, down):
    return F.linear(F.linear(x, up.weight, up.bias).relu(), down.weight, down.bias)


def _gradients(fn, x, up, down, grad):
    tensors = [t for t in (x, up.weight, up.bias, down.weight, down.bias) if t.requires_grad]
    return fn(x, up, down), torch.autograd.grad(fn(x, up, down), tensors, grad)


@pytest.mark.parametrize("x_needs_grad", [True, False])
def test_narrow_input_mlp_matches_autograd(x_needs_grad):
    torch.manual_seed(0)
    up, down = nn.Linear(7, 512).double(), nn.Linear(512, 5).double()
    x = torch.randn(300, 7, dtype=torch.float64, requires_grad=x_needs_grad)
    grad = torch.randn(300, 5, dtype=torch.float64)
    out, grads = _gradients(relu_mlp, x, up, down, grad)
    assert relu_mlp(x, up, down).grad_fn.name() == "ReluMLPBackward"
    expected_out, expected = _gradients(_plain, x, up, down, grad)
    torch.testing.assert_close(out, expected_out)
    assert len(grads) == len(expected) == 4 + x_needs_grad
    for got, want in zip(grads, expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_input_of_transposed_layout():
    """A transposed (non-contiguous) input, such as a view of a time-major tensor: the same result."""
    torch.manual_seed(1)
    up, down = nn.Linear(6, 64), nn.Linear(64, 6)
    x = torch.randn(6, 40).t().requires_grad_()
    assert not x.is_contiguous()
    out, grads = _gradients(relu_mlp, x, up, down, torch.ones(40, 6))
    expected_out, expected = _gradients(_plain, x, up, down, torch.ones(40, 6))
    torch.testing.assert_close(out, expected_out)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_plain_ops_where_the_custom_backward_does_not_serve():
    x = torch.randn(50, 7)
    narrow, wide = (nn.Linear(7, 512), nn.Linear(512, 7)), (nn.Linear(96, 512), nn.Linear(512, 96))
    assert relu_mlp(x, *narrow).grad_fn.name() == "ReluMLPBackward"
    assert relu_mlp(torch.randn(50, 96), *wide).grad_fn.name() != "ReluMLPBackward"  # input not narrow
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = relu_mlp(x, *narrow)
    assert out.dtype == torch.bfloat16 and out.grad_fn.name() != "ReluMLPBackward"
    with torch.no_grad():
        assert relu_mlp(x, *narrow).grad_fn is None


@pytest.mark.parametrize("activation", [torch.relu_, nn.GELU()])
def test_mlp_over_columns_is_the_mlp_of_the_transpose(activation):
    """mlp_over_columns(x) == down(activation(up(x.T))).T, gradients included (TSMixer's time MLP, TimeMixer's
    feature MLPs)."""
    from layers.mlp import mlp_over_columns

    torch.manual_seed(2)
    up, down = nn.Linear(12, 40).double(), nn.Linear(40, 12).double()
    x = torch.randn(12, 30, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(12, 30, dtype=torch.float64)
    plain = lambda x, up, down: _plain(x.t(), up, down).t() if activation is torch.relu_ else \
        F.linear(activation(F.linear(x.t(), up.weight, up.bias)), down.weight, down.bias).t()
    ours = lambda x, up, down: mlp_over_columns(x, up, down, activation)
    out, grads = _gradients(ours, x, up, down, grad)
    expected_out, expected = _gradients(plain, x, up, down, grad)
    torch.testing.assert_close(out, expected_out)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
