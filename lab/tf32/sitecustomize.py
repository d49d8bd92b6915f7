"""TensorFloat-32 products emulated on the CPU, in every Python process started with this folder
on PYTHONPATH (Python imports `sitecustomize` at start-up), so a whole reproduce.py grid runs so:

    PYTHONPATH=lab/tf32 python benchmarks/reproduce.py --models TimesNet --data ETTh1 \
        --horizons 96 --seeds 2021 --extra "--des tf32"

CUDA runs on Ampere and newer GPUs compute cuDNN convolutions in TF32 unless told otherwise
(`torch.backends.cudnn.allow_tf32` is True by default), and matrix products did too before torch
1.12 (`torch.backends.cuda.matmul.allow_tf32`): each operand keeps 10 of fp32's 23 mantissa bits,
and the products are summed in fp32. Published figures come from such runs, ours from fp32 on a
CPU. Here every F.conv1d / F.conv2d / F.linear on float32 rounds its input and weight to TF32 in
the forward pass and the gradient it receives in the backward pass, so the input and weight
gradients are TF32 products as well. TF32_OPS=conv leaves F.linear alone (torch >= 1.12's default).
"""
import os
import sys

import torch
from torch.nn import functional as F


def to_tf32(x):
    """float32 x rounded to the nearest TF32 value, ties away from zero (as `cvt.rna.tf32.f32`)."""
    bits = x.contiguous().view(torch.int32)
    # the sign bit is apart from the magnitude: adding half of the 13 dropped bits' range rounds the
    # magnitude, carrying into the exponent where it must; then the dropped bits are cleared
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


class RoundOperand(torch.autograd.Function):
    """TF32 in the forward pass; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x):
        return to_tf32(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class RoundIncomingGradient(torch.autograd.Function):
    """Identity in the forward pass; the gradient arriving from above is rounded to TF32."""

    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return to_tf32(grad)


def in_tf32(op):
    def wrapped(input, weight, *args, **kwargs):
        if input.dtype != torch.float32:
            return op(input, weight, *args, **kwargs)
        out = op(RoundOperand.apply(input), RoundOperand.apply(weight), *args, **kwargs)
        return RoundIncomingGradient.apply(out)
    wrapped.__name__ = f"{op.__name__}_tf32"
    return wrapped


def emulate(ops):
    """Replace torch.nn.functional's `ops` (names) by their TF32 versions; modules look them up there."""
    for name in ops:
        setattr(F, name, in_tf32(getattr(F, name)))


if __name__ == "sitecustomize":  # at start-up only; a test imports the functions under another name
    OPS = ("conv1d", "conv2d") if os.environ.get("TF32_OPS") == "conv" else ("conv1d", "conv2d", "linear")
    emulate(OPS)
    print(f"TF32 emulated on the CPU for {', '.join(OPS)} (lab/tf32/sitecustomize.py)", file=sys.stderr)
