"""The cost of sample-keyed dropout (issue 43 items 1 and 2): keyed attention on the CPU in bounded memory,
with the masks, output and gradients of the written-out form; the hash behind keyed masks on other devices
in few operations, with the same masks."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from layers import dropout as keyed
from layers.dropout import KeyedDropout, SampleKeys, masks_follow_samples
from utils.keyed_random import signed64, splitmix64

REPO = Path(__file__).resolve().parent.parent


def written_out(query, key, value, p, attn_mask, is_causal, scale):
    """Keyed attention as layers.dropout wrote it out before issue 43: the weights [B, H, L, S] whole."""
    scores = query @ key.transpose(-2, -1) * scale
    if is_causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return keyed.dropout(scores.softmax(-1), p, True) @ value


def _output_and_gradients(attend, q, k, v, mask, samples, first):
    """attend(q, k, v, mask)'s output and the gradients of q, k, v (and of an additive mask), its masks keyed by
    `samples` samples from position `first` on."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.detach().clone().requires_grad_()
    with masks_follow_samples(77, first, samples):
        out = attend(q, k, v, mask)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)).sum().backward()
    return [out, q.grad, k.grad, v.grad] + ([mask.grad] if mask is not None and mask.dtype != torch.bool else [])


def _attend(how, q, k, v, mask, p, causal, samples, first=3):
    """Output and gradients (q, k, v, an additive mask) of keyed attention, `how`: the layer or written_out."""
    def attend(q, k, v, mask):
        if how == "layer":
            layer = KeyedDropout(p).train()
            layer.per_sample_attention = False
            return layer.attend(q, k, v, attn_mask=mask, is_causal=causal, scale=0.3)
        return written_out(q, k, v, p, mask, causal, 0.3)
    return _output_and_gradients(attend, q, k, v, mask, samples, first)


# (p, queries, rows per sample, heads, causal, mask, dtype, weights per block): p 0.1 on samples of 8 192
# elements or more draws the dropped positions, else one integer per element; blocks of one query upwards
CASES = [(0.1, 64, 1, 4, False, "bias", torch.float32, 1000), (0.1, 64, 1, 4, False, "bias", torch.float32, 1 << 20),
         (0.5, 40, 3, 2, True, None, torch.float32, 500), (0.1, 20, 2, 2, False, "bool", torch.float32, 40),
         (0.3, 70, 1, 3, False, "per_row", torch.float64, 2000), (0.05, 128, 1, 2, True, None, torch.float32, 4096)]


@pytest.mark.parametrize("p, queries, rows, heads, causal, mask_kind, dtype, block", CASES)
def test_blocked_keyed_attention_is_the_written_out_one(monkeypatch, p, queries, rows, heads, causal, mask_kind,
                                                        dtype, block):
    """Query blocks of a sample at a time, masks drawn again in backward: the same masks (a mask that differed
    in one weight would move the output by far more than rounding), output and gradients to rounding."""
    from layers import keyed_attention

    monkeypatch.setattr(keyed_attention, "BLOCK_ELEMENTS", block)
    samples, generator = 4, torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, samples * rows, heads, queries, 8, generator=generator, dtype=dtype).unbind(0)
    mask = {"bias": lambda: torch.randn(1, heads, queries, queries, generator=generator, dtype=dtype),
            "per_row": lambda: torch.randn(samples * rows, 1, queries, queries, generator=generator, dtype=dtype),
            "bool": lambda: torch.rand(queries, queries, generator=generator).fill_diagonal_(1.0) > 0.3,
            None: lambda: None}[mask_kind]()
    want, got = _attend("written", q, k, v, mask, p, causal, samples), _attend("layer", q, k, v, mask, p, causal, samples)
    tolerance = 1e-12 if dtype == torch.float64 else 2e-6
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=tolerance, atol=tolerance * a.abs().max().item())


@pytest.mark.parametrize("p, n", [(0.1, 1 << 14), (0.1, 500), (0.5, 3 << 20), (0.3, 70_001)])
def test_a_samples_keep_mask_is_its_keyed_noise(p, n):
    """_sample_keep's bool mask (drawn in chunks) keeps what _keyed_noise's float noise keeps, for both draws."""
    keys = SampleKeys(11, 5, 2)
    noise = keyed._keyed_noise(torch.empty(2, n), p, keys)
    seeds = keyed._sample_seeds(splitmix64(11 ^ splitmix64(0)), 5, 2)
    for sample, seed in enumerate(seeds):
        keep, factor = keyed._sample_keep(n, p, seed, torch.float32)
        assert torch.equal(keep, noise[sample] != 0)
        assert noise[sample].max().item() == factor


PEAK = """
import sys, torch
from pathlib import Path
sys.path.insert(0, {repo!r})
from layers.dropout import KeyedDropout, masks_follow_samples
torch.set_num_threads(1)
heads, tokens = 2, 1280
q, k, v = (torch.randn(1, heads, tokens, 16).requires_grad_() for _ in range(3))
bias = torch.randn(1, heads, tokens, tokens).requires_grad_()  # a learned additive mask, as Timer-XL's
layer = KeyedDropout(0.1).train()
layer.per_sample_attention = False

def step():
    with masks_follow_samples(5, 0, 1):
        layer.attend(q, k, v, attn_mask=bias, scale=0.25).sum().backward()

def kib(field):
    return int(next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field)).split()[1])

step()  # warm-up: the gradients' own memory
Path("/proc/self/clear_refs").write_text("5")  # the high-water mark back to the resident memory
before = kib("VmRSS")
step()
print((kib("VmHWM") - before) * 1024 / (heads * tokens * tokens * 4))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads Linux's /proc high-water mark")
def test_a_training_attention_step_at_1280_tokens_stays_below_its_weights():
    """Issue 43 item 1: one keyed training attention step (forward and backward) at 1 280 tokens rises by
    2 [B, H, S, S] float32 tensors above its start, one of them the learned mask's own gradient; written out
    it rose by 4. Measured in a fresh process as its resident high-water mark, glibc made to unmap every
    freed block (as lab/bench_attention_dropout.py does)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", PEAK.format(repo=str(REPO))], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    weights = float(done.stdout.split()[-1])
    assert weights < 2.5, f"the step rose by {weights:.2f} x [B, H, S, S] in float32"


class _DeviceOps(TorchDispatchMode):
    """The operations that touch a tensor on `device` (views and metadata aside): a device's kernel launches;
    those of them that read or write int64 tensors of `elements` or more: passes over the hashes."""

    FREE = {"view", "unsqueeze", "expand", "_unsafe_view", "alias", "detach", "as_strided"}

    def __init__(self, device, elements):
        super().__init__()
        self.device, self.elements, self.launches, self.int64_passes = device, elements, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        if func.overloadpacket.__name__ not in self.FREE and any(t.device.type == self.device for t in tensors):
            self.launches += 1
            big = [t for t in tensors if t.dtype == torch.int64 and t.numel() >= self.elements]
            self.int64_passes += bool(big)
        return out


def test_the_hash_takes_few_launches():
    """Issue 43 item 2: a GPU's keyed dropout mask (the hash, run here on the meta device, which counts what a
    GPU would launch) in at most 16 operations on the device, 11 of them over int64 hashes: it took 34 and 15."""
    like = torch.empty(8, 4, 64, 64, device="meta")
    with _DeviceOps("meta", like.numel()) as ops:
        keyed._keyed_noise(like, 0.1, SampleKeys(99, 0, 8), hashed=True)
    assert ops.launches <= 16 and ops.int64_passes <= 11, (ops.launches, ops.int64_passes)


def _hashed_written_out(like, p, call_key, first, samples):
    """The hashed noise as written before issue 43: splitmix64 whole, twice, then the float comparison."""
    def mix(x):
        x.add_(signed64(0x9E3779B97F4A7C15))
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
            x.bitwise_xor_((x >> shift) & ((1 << (64 - shift)) - 1))
            if factor:
                x.mul_(signed64(factor))
        return x

    sample_keys = mix(torch.arange(first, first + samples).bitwise_xor_(signed64(call_key)))
    bits = (mix(sample_keys.unsqueeze(1) + torch.arange(like.numel() // samples)) >> 33) & ((1 << 31) - 1)
    noise = torch.empty(like.shape, dtype=keyed._noise_dtype(like))
    return noise.copy_(bits.view(like.shape)).lt_((1 - p) * 2.0**31).div_(1 - p).to(like.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_fewer_operations_hash_the_same_masks(dtype):
    """Bit for bit the masks of the written-out hash, for rates and keys at random, and at the threshold
    itself, where float32's rounding of the 31-bit integers decides (_least_reaching)."""
    generator = torch.Generator().manual_seed(0)
    for p in (0.1, 0.5, 1e-12, 0.999, *torch.rand(6, generator=generator, dtype=torch.float64).tolist()):
        call_key = int(torch.randint(0, 2**62, (), generator=generator)) * 3
        like = torch.empty(6, 7, 300, dtype=dtype)
        want = _hashed_written_out(like, p, call_key, 12, 6)
        assert torch.equal(keyed._hashed_noise(like, p, call_key, 12, 6), want)
        below = keyed._least_reaching(1 - p, keyed._noise_dtype(like))
        near = torch.arange(max(below - 300, 0), min(below + 300, 1 << 31))
        keeps = near.to(keyed._noise_dtype(like)) < (1 - p) * 2.0**31  # as the float noise compares
        assert torch.equal(keeps, near < below)
        assert keyed._keep_below(1 - p, keyed._noise_dtype(like)) == (below << 33) - (1 << 63) - 1


def _attend_paths(path, q, k, v, mask, p, causal, samples, first=3):
    """Output and gradients of keyed attention by `path`: "fused" (every sample at once, hashed masks) or
    "per_sample" (a sample at a time, the same hashed masks drawn per sample, as a GPU ran it before)."""
    from layers import keyed_attention

    def attend(q, k, v, mask):
        if path == "fused":
            layer = KeyedDropout(p).train()
            layer.fused_attention = True
            return layer.attend(q, k, v, attn_mask=mask, is_causal=causal, scale=0.3)
        shape = (q.shape[0] // samples, *q.shape[1:-1], k.shape[-2])
        sample_mask = keyed._sample_masks(shape, p, keyed._noise_dtype(q), q.device, hashed=True)
        return keyed_attention.weights_attention(q, k, v, samples, sample_mask, mask, causal, 0.3)
    return _output_and_gradients(attend, q, k, v, mask, samples, first)


@pytest.mark.parametrize("p, queries, rows, heads, causal, mask_kind, dtype, fused_block", [
    (0.1, 64, 1, 4, False, "bias", torch.float32, 1000), (0.5, 40, 3, 2, True, None, torch.float32, 1 << 24),
    (0.1, 20, 2, 2, False, "bool", torch.float32, 40), (0.3, 70, 1, 3, False, "per_row", torch.float64, 2000),
    (0.3, 33, 1, 4, False, "bias", torch.float32, 1 << 24), (0.2, 24, 2, 3, False, "full", torch.float32, 1 << 24)])
def test_fused_keyed_attention_is_the_per_sample_one(monkeypatch, p, queries, rows, heads, causal, mask_kind, dtype,
                                                     fused_block):
    """One call for every sample (query blocks over all of them, each block's masks hashed for all samples at
    once) against a sample at a time with each sample's own hashed mask: the same masks (one weight kept
    otherwise would move the output far beyond rounding), output and gradients equal to rounding, and bit for
    bit where both take the whole sample as one block."""
    from layers import keyed_attention

    monkeypatch.setattr(keyed_attention, "FUSED_BLOCK_ELEMENTS", fused_block)
    samples, generator = 4, torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, samples * rows, heads, queries, 8, generator=generator, dtype=dtype).unbind(0)
    mask = {"bias": lambda: torch.randn(1, heads, queries, queries, generator=generator, dtype=dtype),
            "per_row": lambda: torch.randn(samples * rows, 1, queries, queries, generator=generator, dtype=dtype),
            "full": lambda: torch.randn(samples * rows, heads, queries, queries, generator=generator, dtype=dtype),
            "bool": lambda: torch.rand(queries, queries, generator=generator).fill_diagonal_(1.0) > 0.3,
            None: lambda: None}[mask_kind]()
    want = _attend_paths("per_sample", q, k, v, mask, p, causal, samples)
    got = _attend_paths("fused", q, k, v, mask, p, causal, samples)
    whole = fused_block >= samples * rows * heads * queries * queries
    tolerance = 1e-12 if dtype == torch.float64 else 2e-6
    for a, b in zip(want, got):
        if whole:
            assert torch.equal(a, b)
        torch.testing.assert_close(b, a, rtol=tolerance, atol=tolerance * a.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_blocks_hashed_keep_mask_is_each_samples_own(dtype):
    """_block_keeps' mask of a query block for every sample: bit for bit the rows of each sample's _hashed_keep."""
    shape, samples, first, p = (2, 3, 17, 11), 5, 40, 0.3  # a sample's weights: 2 rows, 3 heads, 17 x 11
    with masks_follow_samples(9, first, samples):
        block_keep = keyed._block_keeps(p, dtype, torch.device("cpu"))
    call_key = splitmix64(9 ^ splitmix64(0))
    own = torch.cat([keyed._hashed_keep(shape, p, call_key, first + s, 1, torch.device("cpu"), dtype)
                     for s in range(samples)])
    for block in (slice(0, 17), slice(0, 1), slice(5, 12), slice(16, 17)):
        keep, factor = block_keep(block, shape)
        assert keep.shape == (samples * 2, 3, block.stop - block.start, 11)
        assert torch.equal(keep, own[..., block, :])
        assert factor == keyed._divided_one(p, dtype)


def _fused_attention_launches(samples):
    """The device's operations of one fused keyed attention call, forward and backward, on the meta device."""
    q, k, v = (torch.randn(samples, 4, 33, 16, device="meta", requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 4, 33, 33, device="meta", requires_grad=True)  # T5's position bias, as Chronos-Bolt's
    layer = KeyedDropout(0.1).train()
    with _DeviceOps("meta", 0) as ops, masks_follow_samples(5, 0, samples):
        layer.attend(q, k, v, attn_mask=bias).sum().backward()  # the meta device takes the fused path
    return ops.launches


def test_fused_keyed_attention_launches_do_not_grow_with_the_samples():
    """A GPU's keyed attention call was one SDPA per sample (32 windows: 32 launches and reseeds a call, and as
    many in backward); fused, a call's launches are the same for 4 samples as for 32, and few (its mask hashed once)."""
    assert _fused_attention_launches(4) == _fused_attention_launches(32) <= 58


def test_keyed_masks_noise_and_attention_read_nothing_back_from_the_device():
    """Keyed dropout on a device, counted on the meta device (utils.host_syncs): masks, masks drawn at once, a
    model's noise, keyed attention forward and backward, and unkeyed masks drawn here: no device-to-host read and
    no blocking copy (the samples' keys go over in one non-blocking copy a call)."""
    from layers import noise
    from utils.host_syncs import record_host_syncs, summary

    x = torch.empty(8, 4, 33, 16, device="meta", requires_grad=True)
    layer = KeyedDropout(0.1).train()
    with record_host_syncs() as rec:
        with masks_follow_samples(5, 0, 8):
            layer(x), layer(torch.empty(8, 3, device="meta")), KeyedDropout(0.5).train()(x)
            keyed.dropout_noises(x, 0.1, (8, 5), (8, 7))
            layer.attend(x, x, x, attn_mask=torch.empty(1, 4, 33, 33, device="meta")).sum().backward()
            noise.randn(8, 3, device="meta"), noise.rand(16, 2, device="meta")
        with noise.draws_follow_windows([3, 4]):
            noise.randn(4, 5, device="meta")
        keyed.dropout_noise(x, 0.1), keyed.dropout_noise(x, 0.5)
    assert rec.syncs == [], summary(rec)
    assert len(rec.copies) <= 6 and all(site.startswith("layers/dropout.py") for _, _, site in rec.copies), rec.copies
