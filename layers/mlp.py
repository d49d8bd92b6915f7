"""Two-layer MLPs (Linear -> activation -> Linear) laid out for the CPU's matrix products.

relu_mlp runs over the rows of a matrix, with a CPU backward for narrow inputs; mlp_over_columns over
the columns of a feature-major matrix, with the weights on the left.

Autograd's backward of F.linear(x, w1) computes w1's gradient as grad_hidden.T @ x, a [hidden, rows] by
[rows, in] product; when `in` is a handful of columns (TSMixer's channel MLP: 7 channels into 512) MKL
runs that orientation at a fraction of its rate, the dearest product of the step. ReluMLP takes the same
gradient as (x.T @ grad_hidden).T, and folds the first bias into the product as a ones column of x, so
its gradient comes with the weight's instead of from a separate pass over the [rows, hidden] layer:
TSMixer's channel MLP (3072 rows, 7 -> 512 -> 7) 3.1 -> 2.1 ms forward + backward on 2 cores. Wider
inputs (96 -> 512, as in TSMixer's time MLP) measured faster as plain ops, which relu_mlp then runs.
"""
import torch
import torch.nn.functional as F
from torch import nn


class ReluMLP(torch.autograd.Function):
    """relu(x @ w1.T + b1) @ w2.T + b2 for x [rows, in], gradients as the module docstring says."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        x1 = torch.cat([x, x.new_ones(len(x), 1)], dim=1)  # [rows, in + 1]
        w1b = torch.cat([w1.t(), b1.unsqueeze(0)])  # [in + 1, hidden], row-major: see backward
        hidden = torch.mm(x1, w1b).relu_()
        ctx.save_for_backward(x1, w1b, hidden, w2)
        return torch.addmm(b2, hidden, w2.t())

    @staticmethod
    def backward(ctx, grad):
        x1, w1b, hidden, w2 = ctx.saved_tensors
        want_x, want_w1, want_b1, want_w2, want_b2 = ctx.needs_input_grad
        grad_w2 = torch.mm(grad.t(), hidden) if want_w2 else None
        grad_b2 = grad.sum(0) if want_b2 else None
        grad_hidden = torch.mm(grad, w2)
        # the ReLU's backward in place: no second [rows, hidden] tensor
        torch.ops.aten.threshold_backward.grad_input(grad_hidden, hidden, 0, grad_input=grad_hidden)
        grad_w1b = torch.mm(x1.t(), grad_hidden) if want_w1 or want_b1 else None  # [in + 1, hidden]
        grad_x = torch.mm(grad_hidden, w1b[:-1].t()) if want_x else None
        return (grad_x, grad_w1b[:-1].t() if want_w1 else None, grad_w1b[-1] if want_b1 else None,
                grad_w2, grad_b2)


def relu_mlp(x: torch.Tensor, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    """down(relu(up(x))) for x [rows, in]: ReluMLP where it is faster (training on the CPU in fp32 eager,
    input at most an eighth of the hidden width), plain ops elsewhere (autocast and torch.compile among them)."""
    narrow = 8 * up.in_features <= up.out_features and up.bias is not None and down.bias is not None
    if (narrow and x.device.type == "cpu" and torch.is_grad_enabled() and up.weight.requires_grad
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()):
        return ReluMLP.apply(x, up.weight, up.bias, down.weight, down.bias)
    return F.linear(F.linear(x, up.weight, up.bias).relu_(), down.weight, down.bias)


def mlp_over_columns(x: torch.Tensor, up: nn.Linear, down: nn.Linear, activation=torch.relu_) -> torch.Tensor:
    """down(activation(up(x.T))).T for x [in, N], feature-major, computed as it lies: one product with the
    weight on the left per layer and no transposed copy (the biases added in place: addmm with a column bias
    is several times slower on the CPU). TimeMixer's hidden state is feature-major throughout; TSMixer's
    time-major [L, B * C] matrix is feature-major for its time MLP: 0.75 ms forward + backward on 2 cores,
    against 0.88 ms as rows of its transpose."""
    hidden = activation(torch.mm(up.weight, x).add_(up.bias.unsqueeze(1)))
    return torch.mm(down.weight, hidden).add_(down.bias.unsqueeze(1))
