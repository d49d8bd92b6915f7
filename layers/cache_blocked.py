"""Memory-bound layers computed a cache-sized block at a time on the CPU.

A narrow-wide-narrow MLP over many rows or columns (TSMixer's channel MLP, TiDE's wide hidden layers,
TimeMixer's feature MLP) does little arithmetic per element of its wide hidden layer, so plain autograd
spends its time writing that layer, its activation and their gradients to memory and reading them back.
The models' custom autograd functions keep the hidden layer in blocks that fit in cache and recompute
it in backward; `runs_blocked` says where they apply.
"""
import torch
import torch.nn.functional as F


def runs_blocked(x: torch.Tensor) -> bool:
    """Whether the blocked kernels serve `x`: CPU eager fp32. Autocast, other devices (where memory is
    not the bottleneck it is here, and every block would be a kernel launch) and torch.compile (whose
    compiler fuses the plain ops itself) take the plain ops."""
    return x.device.type == "cpu" and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()


class ColumnMLP(torch.autograd.Function):
    """residual + w2 @ gelu(w1 @ x + b1) + b2 for feature-major x [K, M]: an MLP (exact GELU) applied to
    each of the M columns, with M large (TimeMixer: every series' every step at every scale) and the
    widths K, hidden, O small.

    Plain ops write the [hidden, M] pre-activation, the activation and their gradients (tens of MB
    each) and read them back several times. Here they exist one block of columns at a time in two
    buffers reused block after block: forward keeps only x, and backward recomputes each block just
    before using it (a product with inner dimension K). `residual` (None or [O, M]) is added block by
    block instead of in another pass. Same mathematics as the plain ops; the weight gradients sum the
    blocks in another order.
    """

    @staticmethod
    def _blocks(columns: int, hidden: int):
        block = max(1, (1 << 17) // hidden)  # 128k floats: a hidden block and its gradient stay in L2
        return [(start, min(start + block, columns)) for start in range(0, columns, block)]

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, residual=None):
        blocks = ColumnMLP._blocks(x.shape[1], w1.shape[0])
        out = x.new_empty(w2.shape[0], x.shape[1])
        hidden = x.new_empty(w1.shape[0], blocks[0][1])
        # the activation with a row of ones under it, and w2 with b2 beside it: the output bias comes out
        # of the product instead of a broadcast into the (strided) output block
        activated = x.new_ones(w1.shape[0] + 1, blocks[0][1])
        w2b2 = torch.cat([w2, b2.unsqueeze(1)], 1)
        b1 = b1.unsqueeze(1)
        for start, end in blocks:
            h = torch.addmm(b1, w1, x[:, start:end], out=hidden[:, :end - start])
            torch.ops.aten.gelu.out(h, out=activated[:-1, :end - start])
            if residual is None:
                torch.mm(w2b2, activated[:, :end - start], out=out[:, start:end])
            else:
                torch.addmm(residual[:, start:end], w2b2, activated[:, :end - start], out=out[:, start:end])
        ctx.save_for_backward(x, w1, b1, w2)
        ctx.has_residual = residual is not None
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, w1, b1, w2 = ctx.saved_tensors
        blocks = ColumnMLP._blocks(x.shape[1], w1.shape[0])
        want_x = ctx.needs_input_grad[0]
        grad_x = torch.empty_like(x) if want_x else None
        grad_w1, grad_b1, grad_w2 = torch.zeros_like(w1), torch.zeros_like(b1), torch.zeros_like(w2)
        hidden = x.new_empty(w1.shape[0], blocks[0][1])
        activated, grad_hidden = torch.empty_like(hidden), torch.empty_like(hidden)
        for start, end in blocks:
            rows, grad = x[:, start:end], grad_out[:, start:end]
            h = torch.addmm(b1, w1, rows, out=hidden[:, :end - start])
            grad_w2.addmm_(grad, torch.ops.aten.gelu.out(h, out=activated[:, :end - start]).t())
            g = torch.mm(w2.t(), grad, out=grad_hidden[:, :end - start])
            torch.ops.aten.gelu_backward.grad_input(g, h, grad_input=g)  # GELU's backward, in place
            grad_w1.addmm_(g, rows.t())
            grad_b1 += g.sum(1, keepdim=True)
            if want_x:
                torch.mm(w1.t(), g, out=grad_x[:, start:end])
        grad_residual = grad_out if ctx.has_residual and ctx.needs_input_grad[5] else None
        return grad_x, grad_w1, grad_b1.squeeze(1), grad_w2, grad_out.sum(1), grad_residual


def column_mlp(first: torch.nn.Linear, second: torch.nn.Linear, x: torch.Tensor, residual=None) -> torch.Tensor:
    """ColumnMLP with the layers' parameters where it applies, else the same with plain ops."""
    if runs_blocked(x):
        return ColumnMLP.apply(x, first.weight, first.bias, second.weight, second.bias, residual)
    # mm, then the bias in place: addmm with a column bias is several times slower on the CPU
    hidden = F.gelu(torch.mm(first.weight, x).add_(first.bias.unsqueeze(1)))
    out = torch.mm(second.weight, hidden).add_(second.bias.unsqueeze(1))
    return out if residual is None else out.add_(residual)
