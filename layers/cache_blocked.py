"""Memory-bound layers computed a cache-sized block at a time on the CPU.

A narrow-wide-narrow MLP over many rows (TSMixer's channel MLP, TiDE's wide hidden layers) does little
arithmetic per element of its wide hidden layer, so plain autograd spends its time writing that layer,
its activation and their gradients to memory and reading them back. The models' custom autograd
functions keep the hidden layer in blocks that fit in cache and recompute it in backward;
`runs_blocked` says where they apply.
"""
import torch


def runs_blocked(x: torch.Tensor) -> bool:
    """Whether the blocked kernels serve `x`: CPU eager fp32. Autocast, other devices (where memory is
    not the bottleneck it is here, and every block would be a kernel launch) and torch.compile (whose
    compiler fuses the plain ops itself) take the plain ops."""
    return x.device.type == "cpu" and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()
