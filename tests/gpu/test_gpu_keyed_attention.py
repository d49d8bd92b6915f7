"""Keyed attention dropout on a GPU: one call for every sample (layers.keyed_attention's fused path, its masks
hashed on the device for every sample, head, query and key) against the CPU's per-sample form of the same hashed
masks, forward and gradients; and under bf16 autocast, backward in the forward's dtypes."""
import pytest
import torch

from layers import dropout as keyed
from layers import keyed_attention
from layers.dropout import KeyedDropout, masks_follow_samples


def _attend(device, fused, q, k, v, bias, samples=4, p=0.2):
    q, k, v, bias = (t.detach().to(device).requires_grad_() for t in (q, k, v, bias))
    with masks_follow_samples(77, 3, samples):
        if fused:
            out = KeyedDropout(p).train().attend(q, k, v, attn_mask=bias, scale=0.3)  # cuda: the fused path
        else:
            shape = (q.shape[0] // samples, *q.shape[1:-1], k.shape[-2])
            sample_mask = keyed._sample_masks(shape, p, torch.float32, q.device, hashed=True)
            out = keyed_attention.weights_attention(q, k, v, samples, sample_mask, bias, False, 0.3)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (out * weight).sum().backward()
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad, bias.grad)]


def test_gpu_fused_keyed_attention_is_the_cpus_per_sample_form():
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 8, 4, 40, 16, generator=generator).unbind(0)
    bias = torch.randn(1, 4, 40, 40, generator=generator)
    torch.backends.cuda.matmul.allow_tf32 = False
    for got, want in zip(_attend("cuda", True, q, k, v, bias), _attend("cpu", False, q, k, v, bias)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_keyed_attention_trains_under_autocast(dtype):
    x = torch.randn(4, 2, 16, 8, device="cuda")
    bias = torch.randn(1, 2, 16, 16, device="cuda", requires_grad=True)
    projection = torch.nn.Linear(8, 8).cuda()
    with torch.autocast("cuda", dtype=dtype), masks_follow_samples(5, 0, 4):
        h = projection(x)
        out = KeyedDropout(0.3).train().attend(h, h, h, attn_mask=bias)
    out.float().square().sum().backward()
    assert torch.isfinite(bias.grad).all() and torch.isfinite(projection.weight.grad).all()
