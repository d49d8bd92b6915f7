"""Dropout, the only randomness of training, drawn so that it follows the sample rather than the process.

Inside `masks_follow_samples(key, first, samples)` (Exp_Forecast.train_step opens it around each
training forward) every dropout mask is drawn sample by sample: the rows of sample s come from a
generator seeded with (key, the mask's call number in the forward, first + s), where `first + s` is
the sample's position in the epoch's global order (data_provider.global_batches). A window therefore
gets the same masks whichever process trains it and however its global batch is cut into micro-batches:
1 x 32, 2 x 16 and 1 x 16 with 2 accumulation steps draw the same numbers (the keys: utils.keyed_random).
Outside the context (evaluation, a model used on its own, `--compile`) masks come from the global generator
as usual.

A model file uses plain nn.Dropout: when the experiment builds the model, KeyedDropout.convert turns every
nn.Dropout into a KeyedDropout (as torch.nn.SyncBatchNorm.convert_sync_batchnorm converts BatchNorm),
keyed whenever its input's first dimension holds the micro-batch's samples, k rows each, sample-major
([B, ...] or a channel-independent [B * C, ...]); any other input gets ordinary dropout, and the run
says so once, naming the module (DropoutReport). Attention in layers/ takes its dropout module:
`attention(q, k, v, dropout)` runs PyTorch's fused scaled_dot_product_attention; keyed, the weights are
formed in query blocks with keyed masks, on a GPU for all samples of a call at once (KeyedDropout.attend).
Zoo models with a measured faster path draw masks themselves with `dropout`, `add_dropout`,
`dropout_noise(s)` (their docstrings name the gain). tests/test_model_contract.py trains every model as 1 x 8 and 2 x 4.

On the CPU the masks also cost less than F.dropout's: it draws a double per element from a serial
generator, the dearest part of a small training step after the matrix products; dropout_noise draws
one 31-bit integer per element, or for small p only the dropped positions.
"""
import contextlib
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from layers.keyed_attention import fused_weights_attention, weights_attention
from utils import keyed_random
from utils.keyed_random import FACTOR_1, FACTOR_2, GOLDEN_GAMMA, signed64, splitmix64, splitmix64_finaliser

_keys = None  # the active SampleKeys, or None


class SampleKeys:
    """What masks_follow_samples keys masks by; `calls` counts the masks drawn in the forward so far."""

    def __init__(self, key, first, samples):
        self.key, self.first, self.samples, self.calls = key, first, samples, 0


@contextlib.contextmanager
def masks_follow_samples(key, first, samples):
    """Within it, masks follow the sample (module docstring): `key` an int naming the run and epoch,
    `first` the global position of the micro-batch's first sample, `samples` its number of samples."""
    global _keys
    previous, _keys = _keys, SampleKeys(key, first, samples)
    try:
        yield
    finally:
        _keys = previous


def mask_key(seed, epoch):
    """The key of an epoch's masks in a run of seed `seed`."""
    return splitmix64(splitmix64(seed) ^ epoch)


_generators = {}  # one reseeded generator per device: creating one per sample costs more than drawing


def _generator(device):
    if device not in _generators:
        _generators[device] = torch.Generator(device=device)
    return _generators[device]


def _keyed_noise(like, p, keys, hashed=None):
    """dropout_noise for `like`, sample by sample from the samples' keys: on the CPU from a generator reseeded
    per sample (the cost of unkeyed masks, plus a reseed per sample); elsewhere (`hashed`) from a hash of
    (key, element) computed for every element at once, a dozen elementwise kernels whatever the batch,
    where a launch per sample would cost a GPU more than the draws. The two give different masks, each the
    same on any number of processes."""
    rows = like.shape[0] // keys.samples if like.dim() and keys.samples else 0
    if rows * keys.samples != (like.shape[0] if like.dim() else 1) or rows == 0:
        raise RuntimeError(f"a dropout input of shape {tuple(like.shape)} does not hold the micro-batch's "
                           f"{keys.samples} samples along its first dimension, so its masks cannot follow "
                           "them: give the model `randomness_follows_sample = False` (layers/dropout.py)")
    call_key = _next_call_key(keys)
    if like.device.type != "cpu" if hashed is None else hashed:
        return _hashed_noise(like, p, call_key, keys.first, keys.samples)
    generator = _generator(like.device)
    seeds = _sample_seeds(call_key, keys.first, keys.samples)
    if p < 0.25 and like.numel() // keys.samples >= 1 << 13:  # large samples: only their dropped positions
        return _keyed_dropped(like.shape, p, seeds, generator, _noise_dtype(like), like.device).to(like.dtype)
    noise = torch.empty(like.shape, dtype=_noise_dtype(like), device=like.device)
    # one 31-bit integer per element, each sample's from its own seed; the rest in one pass over them all
    bits = torch.empty(like.shape, dtype=torch.int32, device=like.device)
    for part, seed in zip(bits.view(keys.samples, -1).unbind(0), seeds):
        generator.manual_seed(seed)
        part.random_(generator=generator)
    keep = 1.0 - p
    return noise.copy_(bits).lt_(keep * 2.0**31).div_(keep).to(like.dtype)


def _next_call_key(keys=None):
    """The key of the forward's next mask (its call number mixed into the run's key); counts the call."""
    keys = keys or _keys
    call, keys.calls = keys.calls, keys.calls + 1
    return keyed_random.call_key(keys.key, call)


def _host_sample_keys(call_key, first, samples):
    """splitmix64(call_key ^ (first + s)) for each sample s, as a numpy uint64 array: on the host, where the
    keys are known (hundreds of samples a call in Python integers would cost more than their draws)."""
    positions = np.arange(first, first + samples, dtype=np.uint64) ^ np.uint64(call_key)
    return splitmix64_finaliser(positions + np.uint64(GOLDEN_GAMMA))


def _sample_keys(call_key, first, samples):
    """_host_sample_keys as an int64 tensor on the CPU (the same 64 bits)."""
    return torch.from_numpy(_host_sample_keys(call_key, first, samples).view(np.int64))


def _sample_seeds(call_key, first, samples):
    """Each sample's key >> 1 (seeds below 2**63) as Python integers."""
    return (_host_sample_keys(call_key, first, samples) >> np.uint64(1)).tolist()


def _device_sample_keys(call_key, first, samples, device):
    """_sample_keys plus splitmix64's increment, on `device`: one copy, from pinned memory on a GPU so that it
    neither waits for the device nor makes the device wait for the host."""
    keys = _sample_keys(call_key, first, samples).add_(_GOLDEN)
    if device.type == "cuda":
        keys = keys.pin_memory()
    return keys.to(device, non_blocking=True)


def _keyed_dropped(shape, p, seeds, generator, dtype=torch.float32, device=None):
    """_fill_noise's dropped positions for a tensor of `shape` holding the samples' rows along dim 0, each
    sample's from its own seed: the draws sample by sample, the arithmetic on all samples at once (what
    makes the per-sample masks affordable); the very masks a per-sample _fill_noise would give."""
    samples, n = len(seeds), math.prod(shape) // len(seeds)
    expected = n * p
    draws = int(expected + 6.0 * math.sqrt(expected) + 16)  # as dropped_positions' first round
    u = torch.empty(samples, draws, dtype=torch.int32, device=device)
    for row, seed in zip(u.unbind(0), seeds):
        generator.manual_seed(seed)
        row.random_(generator=generator)
    positions = _hits(u, math.log1p(-p))
    short = (positions[:, -1] < n).nonzero().flatten().tolist()  # a second round: about 1e-9 per sample
    # The draws past a sample's n elements go to one spare element after the masks, so every position is
    # filled as it is (no boolean indexing, which costs a nonzero and a gather)
    spare = samples * n
    inside = positions < n
    offsets = torch.arange(0, spare, n, device=device, dtype=torch.float64).unsqueeze(1)
    index = torch.where(inside, positions.add_(offsets), spare).long()
    store = torch.empty(spare + 1, dtype=dtype, device=device).fill_(1.0 / (1.0 - p))
    store.index_fill_(0, index.view(-1), 0.0)
    noise = store[:spare].view(shape)
    for sample in short:  # redrawn whole, over what its first round filled
        generator.manual_seed(seeds[sample])
        _fill_noise(noise[sample], p, generator)
    return noise


def _sample_masks(shape, p, dtype, device, hashed=None):
    """For this call (it takes a call number): a function giving sample s's (bool keep mask of `shape`, the
    kept elements' factor), the mask _keyed_noise draws for a tensor holding the samples' `shape` blocks
    along dim 0, bit for bit, and the same each time it is asked (keyed attention draws it again in backward
    rather than keep it): on the CPU by the sample's generator (_sample_keep), elsewhere (`hashed`) by the hash."""
    call_key, first = _next_call_key(), _keys.first
    if device.type != "cpu" if hashed is None else hashed:
        return lambda s: (_hashed_keep(shape, p, call_key, first + s, 1, device, dtype), _divided_one(p, dtype))
    seeds = _sample_seeds(call_key, first, _keys.samples)

    def sample_mask(s):
        keep, factor = _sample_keep(math.prod(shape), p, seeds[s], dtype)
        return keep.view(shape), factor

    return sample_mask


def _block_keeps(p, dtype, device):
    """For this call (it takes a call number): a function of a query block and a sample's weights shape
    (rows, ..., L, S) giving (the bool keep mask of the block for every sample of the call, [samples * rows,
    ..., len(block), S], the kept elements' factor): for each sample the block of its _hashed_keep mask, bit for
    bit, hashed for that block alone; the samples' keys go to the device once for the call."""
    call_key, first, samples = _next_call_key(), _keys.first, _keys.samples
    keys = _device_sample_keys(call_key, first, samples, device)
    factor = _divided_one(p, dtype)

    def block_keep(block, sample_shape):
        rows, queries, keys_ = math.prod(sample_shape[:-2]), sample_shape[-2], sample_shape[-1]
        # a sample's element j = (row and head) * L * S + query * S + key; a block's queries are a run of j
        outer = torch.arange(0, rows * queries * keys_, queries * keys_, device=device)
        inner = torch.arange(block.start * keys_, block.stop * keys_, device=device)
        x = (keys.view(samples, 1, 1) + outer.view(1, rows, 1)) + inner.view(1, 1, -1)
        keep = _keep_of_hashes(x, p, dtype)
        return keep.view(samples * sample_shape[0], *sample_shape[1:-2], len(inner) // keys_, keys_), factor

    return block_keep


def _divided_one(p, dtype):
    """1 / (1 - p) as the integer path computes the factor (1.0 in `dtype`, divided), on the host: numpy's
    float32 division rounds as a float32 tensor's does."""
    if dtype == torch.float64:
        return 1.0 / (1.0 - p)
    return float(np.float32(1.0) / np.float32(1.0 - p))


def _rounded(value, dtype):
    """A Python float rounded to `dtype` (float32 or float64), as torch.tensor(value, dtype=dtype).item()."""
    return value if dtype == torch.float64 else float(np.float32(value))


DRAW_CHUNK = 1 << 20  # 31-bit draws at a time: a generator's stream cut in chunks is the same stream


def _sample_keep(n, p, seed, dtype):
    """The keep mask (bool, [n]) _keyed_noise draws on the CPU for a sample of n elements from its seed, and
    its factor, in n bytes: for p < 0.25 and large samples the dropped positions (_keyed_dropped for one
    sample), else one 31-bit integer per element, compared as the float noise of `dtype` compares it."""
    generator = _generator(torch.device("cpu"))
    generator.manual_seed(seed)
    keep = torch.ones(n, dtype=torch.bool)
    if p < 0.25 and n >= 1 << 13:
        expected = n * p
        draws = torch.empty(1, int(expected + 6.0 * math.sqrt(expected) + 16), dtype=torch.int32)
        positions = _hits(draws.random_(generator=generator), math.log1p(-p))[0]
        if positions[-1] < n:  # short: redrawn whole, as _keyed_dropped's second round
            generator.manual_seed(seed)
            positions = dropped_positions(n, p, generator=generator)
        keep.index_fill_(0, positions[positions < n].long(), False)
        return keep, _rounded(1.0 / (1.0 - p), dtype)
    below = _least_reaching(1.0 - p, dtype)  # bits < below exactly when float(bits) < (1 - p) * 2**31
    for part in keep.split(DRAW_CHUNK):
        part.copy_(torch.empty(part.shape, dtype=torch.int32).random_(generator=generator).le_(below - 1))
    return keep, _divided_one(p, dtype)


def _hashed_noise(like, p, call_key, first, samples):
    """Element j of sample s is kept when the top 31 bits of splitmix64(splitmix64(call_key ^ (first + s)) + j),
    uniform on [0, 2**31), fall below (1 - p) * 2**31 as the noise's dtype holds both: the distribution of
    _fill_noise's integer path. The factor from _hashed_keep's bool mask, in two passes over the output."""
    keep = _hashed_keep(like.shape, p, call_key, first, samples, like.device, _noise_dtype(like))
    return keep.to(_noise_dtype(like)).div_(1.0 - p).to(like.dtype)


# splitmix64's constants as int64 (utils.keyed_random): the increment, the two factors, and the sign bit
_GOLDEN, _FACTOR_1, _FACTOR_2, _SIGN = (signed64(c) for c in (GOLDEN_GAMMA, FACTOR_1, FACTOR_2, 1 << 63))


def _hashed_keep(shape, p, call_key, first, samples, device, dtype=torch.float32):
    """The bool mask of _hashed_noise (True: kept), in 13 operations on the device, 11 of them passes over
    the int64 hashes (it took 33 and 15). Exact integer identities, each a pass saved:
    - the samples' keys (a few hundred integers) are mixed on the host, so one copy, not 14 launches;
    - splitmix64's increment goes into each sample's key, not into every element;
    - its last step x ^ (x >>> 31) leaves the top 31 bits as they are, and only those are read;
    - `top 31 bits < threshold` is an unsigned comparison of the whole word, done as a signed one after
      flipping the sign bit (_keep_below)."""
    sample_keys = _device_sample_keys(call_key, first, samples, device)
    x = sample_keys.unsqueeze(1) + torch.arange(math.prod(shape) // samples, device=device)
    return _keep_of_hashes(x, p, dtype).view(shape)


def _keep_of_hashes(x, p, dtype):
    """Whether each element is kept, from x = a sample's key + splitmix64's increment + the element's index
    (int64, overwritten): the rest of splitmix64, then the comparison of its top 31 bits."""
    for shift, factor in ((30, _FACTOR_1), (27, _FACTOR_2)):  # a logical shift: arithmetic, then masked
        x.bitwise_xor_(torch.bitwise_right_shift(x, shift).bitwise_and_((1 << (64 - shift)) - 1)).mul_(factor)
    return x.bitwise_xor_(_SIGN).le(_keep_below(1.0 - p, dtype))


def _keep_below(keep, dtype):
    """The signed bound of _hashed_keep's comparison: x (sign bit flipped) <= bound exactly when
    float(x >>> 33) < keep * 2**31 in `dtype` (_least_reaching)."""
    return (_least_reaching(keep, dtype) << 33) - (1 << 63) - 1  # top 31 bits below it, sign bit flipped


@functools.lru_cache(maxsize=64)
def _least_reaching(keep, dtype):
    """The least 31-bit integer b with float(b) >= keep * 2**31 in `dtype`: a float noise compares the
    integer rounded to its dtype (float32 rounds integers above 2**24), with the threshold rounded to it
    too, so b < this exactly when the noise keeps b. By bisection, rounding as the noise's copy does."""
    threshold = torch.tensor(keep * 2.0**31, dtype=dtype)
    low, high = 0, 1 << 31
    while low < high:
        middle = (low + high) // 2
        if torch.tensor(middle, dtype=torch.int64).to(dtype) >= threshold:
            high = middle
        else:
            low = middle + 1
    return low


def _noise_dtype(like):
    return torch.float64 if like.dtype == torch.float64 else torch.float32


def _fill_noise(out, p, generator=None):
    """Fill `out` with dropout's factor: 1 / (1 - p) with probability 1 - p, else 0 (0 < p < 1)."""
    keep = 1.0 - p
    # only the dropped positions (about p draws per element, in some fifteen operations) on the CPU: their number
    # is read on the host, which a GPU would wait for
    if p < 0.25 and out.device.type == "cpu":
        out.fill_(1.0 / keep)
        out.view(-1).index_fill_(0, dropped_positions(out.numel(), p, out.device, generator), 0.0)
        return out
    bits = torch.empty(out.shape, dtype=torch.int32, device=out.device).random_(generator=generator)
    return out.copy_(bits).lt_(keep * 2.0**31).div_(keep)  # bits uniform on [0, 2**31)


def dropout_noise(like: torch.Tensor, p: float, batch_dim: int = 0) -> torch.Tensor:
    """The factor F.dropout multiplies by, for a tensor like `like`: 1 / (1 - p) with probability 1 - p,
    else 0. Keyed by the sample inside masks_follow_samples (`batch_dim`: the dimension that holds the
    samples' rows); else from the global generator, with the same distribution as F.dropout's mask from
    fewer random numbers (module docstring)."""
    keep = 1.0 - p
    if keep == 0.0 or keep == 1.0:
        return torch.full_like(like, keep)
    if _keys is not None:
        return _keyed_noise(like.movedim(batch_dim, 0), p, _keys).movedim(0, batch_dim)
    noise = torch.empty(like.shape, dtype=_noise_dtype(like), device=like.device)
    return _fill_noise(noise, p).to(like.dtype)


def dropout_noises(like: torch.Tensor, p: float, *shapes, batch_dims=None) -> list[torch.Tensor]:
    """dropout_noise for tensors of several shapes (dtype and device of `like`), drawn at once; when they
    follow the samples, each sample's masks of every shape in one draw (`batch_dims`: each shape's
    dimension holding the samples' rows, default 0), then cut into the shapes."""
    if _keys is not None:
        samples = _keys.samples
        moved = [(shape[b], *shape[:b], *shape[b + 1:]) for shape, b in zip(shapes, batch_dims or [0] * len(shapes))]
        for shape in moved:
            if shape[0] % samples:
                raise RuntimeError(f"a dropout mask of {shape[0]} rows along its samples' dimension does not hold "
                                   f"the micro-batch's {samples} samples: give the model `randomness_follows_sample "
                                   "= False` (layers/dropout.py)")
        sizes = [math.prod(shape) // samples for shape in moved]
        noise = dropout_noise(like.new_empty(samples, sum(sizes)), p)
        return [piece.reshape(shape).movedim(0, b) for piece, shape, b in
                zip(noise.split(sizes, dim=1), moved, batch_dims or [0] * len(shapes))]
    sizes = [math.prod(shape) for shape in shapes]
    noise = dropout_noise(like.new_empty(sum(sizes)), p)
    return [part.view(shape) for part, shape in zip(noise.split(sizes), shapes)]


def _hits(bits, log_miss):
    """The positions of the hits along the last dimension of 31-bit draws `bits`, from 0: the gaps between
    hits are geometric, floor(log(u) / log(1 - p)) misses before each, u = (bits + 1) / 2**31 on (0, 1]."""
    u = bits.to(torch.float64).add_(1.0).mul_(2.0**-31)
    steps = u.log_().div_(log_miss).floor_().add_(1.0)  # from one hit to the next
    return steps.cumsum_(-1).sub_(1.0)  # integers in float64: exact below 2**53


def dropped_positions(n: int, p: float, device=None, generator=None) -> torch.Tensor:
    """The positions in [0, n) that independent Bernoulli(p) trials hit, in increasing order.

    Sampled by the gaps between hits, geometric: floor(log(u) / log(1 - p)) misses before each hit for u
    uniform on (0, 1] with 31 random bits (so the distribution is exact to 2**-31); about n * p draws."""
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=device)
    log_miss = math.log1p(-p)
    chunks, start = [], 0
    while start < n:  # a second round has a probability of about 1e-9
        expected = (n - start) * p
        draws = int(expected + 6.0 * math.sqrt(expected) + 16)
        bits = torch.empty(draws, dtype=torch.int32, device=device).random_(generator=generator)
        positions = _hits(bits, log_miss).add_(start)
        chunks.append(positions)
        start = int(positions[-1]) + 1
    positions = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    return positions[: int(torch.searchsorted(positions, float(n)))].long()


def fused_dropout(x: torch.Tensor) -> bool:
    """Whether F.dropout's own kernel serves `x`, not a mask drawn here: outside masks_follow_samples, on a
    GPU (which fuses it) or under torch.compile (which fuses it with the operations around it; the masks
    drawn here would break the graph at every dropout)."""
    return _keys is None and (x.device.type != "cpu" or torch.compiler.is_compiling())


def shared_rate(like: torch.Tensor, rates, training: bool):
    """The one rate of a forward's dropouts when layers.dropout draws their masks itself, so that a model can
    draw them all at once (dropout_noises: on the CPU one reseed per sample, not one per sample and mask);
    None where that does not serve: not training, no dropout, rates that differ, or F.dropout's own kernel
    (fused_dropout), in which case each dropout draws its own mask or runs F.dropout."""
    rates = list(rates)
    p = rates[0] if rates else 0.0
    return p if training and 0.0 < p < 1.0 and not fused_dropout(like) and all(r == p for r in rates) else None


def keyed() -> bool:
    """Whether masks follow the samples here (inside masks_follow_samples)."""
    return _keys is not None


def sample_seeds(x: torch.Tensor):
    """Inside masks_follow_samples and for an x whose first dimension holds the samples' rows: one seed per
    sample, for a random draw other than a dropout mask that must follow the sample too (ProbAttention's key
    sample); it takes a call number, as a mask does. None elsewhere."""
    if _keys is None or _unkeyable_input(x, _keys.samples) is not None:
        return None
    return _sample_seeds(_next_call_key(), _keys.first, _keys.samples)


def dropout(x: torch.Tensor, p: float, training: bool, noise: torch.Tensor | None = None,
            batch_dim: int = 0) -> torch.Tensor:
    """F.dropout(x, p, training) with this module's masks; `noise`: that mask, drawn already (dropout_noises);
    `batch_dim`: as dropout_noise's."""
    if noise is not None:
        return x * noise
    if not training or p == 0.0:
        return x
    if fused_dropout(x):
        return F.dropout(x, p, True)
    return x * dropout_noise(x, p, batch_dim)


def add_dropout(x: torch.Tensor, y: torch.Tensor, p: float, training: bool,
                noise: torch.Tensor | None = None, batch_dim: int = 0) -> torch.Tensor:
    """x + dropout(y, p, training, noise, batch_dim), the residual connection after a sublayer: one multiply-add."""
    if noise is None and (not training or p == 0.0):
        return x + y
    if noise is None and fused_dropout(y):
        return x + F.dropout(y, p, True)
    return torch.addcmul(x, y, dropout_noise(y, p, batch_dim) if noise is None else noise)


class DropoutReport:
    """Which converted dropouts drew keyed masks: `exact` maps a module's qualified name to True while every
    call was keyed, False from its first unkeyed call on, when `warn` hears of it (once per module)."""

    def __init__(self, exact=None, warn=None):
        self.exact = {} if exact is None else exact
        self.warn = warn

    def heard(self, name, exact, why=""):
        known = self.exact.get(name)
        if known is False or known == exact:  # a module that fell back once stays so, told once
            return
        self.exact[name] = exact
        if not exact and self.warn is not None:
            self.warn(f"dropout {name} is not keyed by the sample ({why}): its masks come from each process's "
                      "generator, so training depends on the number of processes; hold the samples along the "
                      "first dimension of its input ([B, ...] or [B * k, ...], k rows per sample in order)")


def _unkeyable_input(x, samples):
    """Why x's first dimension does not hold `samples` samples, k >= 1 rows each, or None when it does (a first
    dimension that is a multiple by chance, such as [features, B] with B dividing features, is not told apart)."""
    rows = x.shape[0] if x.dim() else 0
    if rows >= samples and rows % samples == 0:
        return None
    return (f"an input of shape {tuple(x.shape)}, whose first dimension is no multiple of the micro-batch's "
            f"{samples} samples")


def _samples_behind_a_leading_one(x):
    """Whether x is [1, samples * k, ...] for several samples: a recurrent layer's hidden state [layers, B, d]
    of one layer keeps the samples in its second dimension."""
    return x.dim() > 1 and x.shape[0] == 1 and _keys.samples > 1 and _unkeyable_input(x[0], _keys.samples) is None


class KeyedDropout(nn.Dropout):
    """nn.Dropout whose masks follow the sample inside masks_follow_samples (module docstring); the same rate,
    state_dict and repr. `qualified_name` and `report` (a DropoutReport) are set by convert."""

    per_sample_attention = None  # attend: True, one fused SDPA call per sample; else the weights formed here
    fused_attention = None  # ... for every sample at once, hashed masks (None: on devices other than the CPU)

    def __init__(self, p=0.5, inplace=False, qualified_name="", report=None):
        super().__init__(p, inplace)
        self.qualified_name, self.report = qualified_name, report

    @classmethod
    def convert(cls, module, report=None, prefix=""):
        """`module` with every nn.Dropout replaced by a KeyedDropout of its rate (itself, if it is one), named by
        its qualified name; other dropout kinds (Dropout2d, AlphaDropout, ...) stay, and `report` hears of them."""
        converted = module
        if type(module) in (nn.Dropout, cls):
            converted = cls(module.p, module.inplace, prefix, report).train(module.training)
        elif isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0 and report is not None:
            report.heard(prefix, False, f"{type(module).__name__} is not converted")
        for name, child in module.named_children():
            converted.add_module(name, cls.convert(child, report, f"{prefix}.{name}" if prefix else name))
        return converted

    def keyable(self, x):
        """Whether x's masks can follow the samples here (inside masks_follow_samples), telling the report;
        an input that cannot still takes its call number, so the modules after it keep theirs."""
        why = _unkeyable_input(x, _keys.samples)
        if self.report is not None:
            self.report.heard(self.qualified_name, why is None, why)
        if why is not None:
            _keys.calls += 1
        return why is None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.p > 0.0 and _keys is not None:
            if _samples_behind_a_leading_one(x):  # an RNN's [1, B * k, d] state (TSLib's SegRNN)
                return self.forward(x[0]).unsqueeze(0)
            if not self.keyable(x):
                return F.dropout(x, self.p, True, self.inplace)
        return dropout(x, self.p, self.training)

    def attend(self, query, key, value, attn_mask=None, is_causal=False, scale=None):
        """F.scaled_dot_product_attention with dropout self.p on the attention weights in training. Keyed, the
        weights are formed by layers.keyed_attention in query blocks, recomputed in backward: on a GPU (wherever
        `fused_attention` says) a block holds every sample of the call and its masks are hashed there for all
        of them at once, so a call costs some twenty launches whatever the number of samples (one
        scaled_dot_product_attention per sample under its seed, `per_sample_attention`, cost a launch and a
        reseed per sample); on the CPU, which has no fused kernel with dropout (SDPA forms the weights there
        anyway), a block holds one sample and its masks are this module's cheaper generator draws:
        lab/results/bench_attention_dropout_cpu.json weighs the CPU's choices."""
        p = self.p if self.training else 0.0
        if p == 0.0 or _keys is None or not self.keyable(query):
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=p,
                                                  is_causal=is_causal, scale=scale)
        if self.per_sample_attention:
            return _per_sample_attention(query, key, value, p, attn_mask, is_causal, scale)
        fused = self.fused_attention
        if query.device.type != "cpu" if fused is None else fused:
            block_keep = _block_keeps(p, _noise_dtype(query), query.device)
            return fused_weights_attention(query, key, value, _keys.samples, block_keep, attn_mask, is_causal, scale)
        shape = (query.shape[0] // _keys.samples, *query.shape[1:-1], key.shape[-2])  # a sample's weights
        sample_mask = _sample_masks(shape, p, _noise_dtype(query), query.device)
        return weights_attention(query, key, value, _keys.samples, sample_mask, attn_mask, is_causal, scale)


def _per_sample_attention(query, key, value, p, attn_mask, is_causal, scale):
    """scaled_dot_product_attention on each sample's rows (inside masks_follow_samples, their number a multiple
    of the samples') under the device's default generator seeded with the sample's key, and restored after."""
    seeds = _sample_seeds(_next_call_key(), _keys.first, _keys.samples)
    rows = query.shape[0] // len(seeds)
    per_row_mask = attn_mask is not None and attn_mask.dim() == query.dim() and attn_mask.shape[0] == query.shape[0]
    device = query.device
    generator = torch.default_generator if device.type == "cpu" else torch.cuda.default_generators[
        device.index if device.index is not None else torch.cuda.current_device()]
    state, outs = generator.get_state(), []
    try:
        for s, seed in enumerate(seeds):
            generator.manual_seed(seed)
            part = slice(s * rows, (s + 1) * rows)
            outs.append(F.scaled_dot_product_attention(
                query[part], key[part], value[part], attn_mask=attn_mask[part] if per_row_mask else attn_mask,
                dropout_p=p, is_causal=is_causal, scale=scale))
    finally:
        generator.set_state(state)  # the global stream goes on as if untouched
    return torch.cat(outs)


def attention(query, key, value, weights_dropout: nn.Dropout, attn_mask=None, is_causal=False, scale=None):
    """F.scaled_dot_product_attention with `weights_dropout` (its rate, in training) on the attention weights:
    PyTorch's fused kernels; keyed by the sample when it is a KeyedDropout inside masks_follow_samples."""
    if isinstance(weights_dropout, KeyedDropout):
        return weights_dropout.attend(query, key, value, attn_mask, is_causal, scale)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                          dropout_p=weights_dropout.p if weights_dropout.training else 0.0)
