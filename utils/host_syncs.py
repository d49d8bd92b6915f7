"""Counting host<->device synchronisations without a device: run the code on PyTorch's meta device under
`record_host_syncs()`, and every op that on CUDA would make the host wait for the device (a device-to-host read)
or copy host memory to the device in a blocking way is logged with its call site, beside a count of every aten op
run on the device.

    model, batch = to_meta(model), to_meta(batch)
    with record_host_syncs() as rec:
        loss = model(*batch).mean(); loss.backward()
    rec.syncs      # [(kind, op, call site)], kind "d2h" (the host reads device memory) or "h2d" (a blocking copy)
    rec.copies     # non-blocking host -> device copies (no stream sync), [(kind, op, call site)]
    rec.op_counts  # {aten op: times run on the device}

Meta tensors carry device, dtype and shape but no data, so the ops whose result depends on the data (.item(),
nonzero, a boolean index, unique, bincount ...) cannot run there; the recorder logs them and hands back a
plausible stand-in (a check passes, other scalars are 0, a mask is taken as all true, counts spread evenly) so
the rest of the step runs and its later syncs are found too. Host data reaching the device is logged too: a
tensor built from Python data there, .to(device) without non_blocking, indexing with a Python list or host
indices. The stand-in's values are remembered, so reading
one back (.tolist() of a bincount) gives the same values its shape was built from.

Code that picks its path by `device.type == "cuda"` takes its non-CUDA path on meta (one asking `!= "cpu"` its
device path): what is counted is the path taken. Meta has no autocast state and no random generator: while
recording, autocast reads as off there and torch.Generator(device="meta") is a CPU one (_meta_shims).
"""
import contextlib
import os
import sys
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
DEVICE = torch.device("meta")
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS_FILE = os.path.abspath(__file__)
_ROOT = os.path.dirname(os.path.dirname(_THIS_FILE)) + os.sep

# Ops whose CUDA kernel reads device memory on the host to size its output (or to return a Python value).
# bincount reads the input's max whatever minlength says; repeat_interleave only without output_size.
_SIZED_BY_DATA = {
    aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
    aten.unique_consecutive.default, aten._unique.default, aten.bincount.default, aten.equal.default,
    aten.allclose.default, aten.repeat_interleave.Tensor,
}
_INDEX = {aten.index.Tensor}
_INDEX_PUT = {aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
_COPIES = {aten._to_copy.default, aten.copy_.default}
# A bool read back is mostly a check (validation, NaN guards): all() reads as True and any() as False, so the
# code goes on as with valid data; other scalars read as 0.
_CHECKS = {aten.all.default: True, aten._is_all_true.default: True, aten.any.default: False,
           aten._is_any_true.default: False}


def call_site():
    """'path:line (function)' of the innermost frame outside torch and this file: the line of the code that asked
    for the op (for a backward op, the line calling backward())."""
    frame = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_TORCH_DIR) and name != _THIS_FILE:
            shown = name[len(_ROOT):] if name.startswith(_ROOT) else name.split("site-packages" + os.sep)[-1]
            return f"{shown}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


def _on_device(t):
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE.type


def _tensors(tree):
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def to_meta(obj):
    """`obj` (a module, a tensor, or a tuple/list/dict of them, other leaves kept) moved to the meta device; do it
    before recording, as the real batch is on the device before the step begins."""
    if isinstance(obj, torch.nn.Module):
        return obj.to(DEVICE)
    return torch.utils._pytree.tree_map(lambda t: t.to(DEVICE) if isinstance(t, torch.Tensor) else t, obj)


class HostSyncRecorder(TorchDispatchMode):
    """The dispatch-level half of the recorder: sees every aten op (forward and backward) with its tensors."""

    def __init__(self):
        super().__init__()
        self.syncs = []
        self.copies = []  # non-blocking host -> device copies: (kind, op, call site)
        self.op_counts = Counter()
        self.known = WeakIdKeyDictionary()  # stand-in on meta -> its values on the host, for a later read-back

    # -------------------------------------------------------------- what is logged
    def log(self, kind, op):
        self.syncs.append((kind, str(op), call_site()))

    def count(self, kind):
        """How many syncs of `kind` ("d2h", "h2d") were logged."""
        return sum(1 for k, _, _ in self.syncs if k == kind)

    def remember(self, stand_in, values):
        self.known[stand_in] = values
        return stand_in

    # -------------------------------------------------------------- stand-ins for data the meta device has not
    def _read_back(self, t, dtype=None):
        """A device tensor's values on the host: the remembered stand-in's, else zeros of its shape."""
        values = self.known.get(t)
        if values is None or values.shape != t.shape:
            values = torch.zeros(t.shape, dtype=t.dtype)
        return values.to(dtype or t.dtype).clone()

    def _mask_as_all_true(self, indices):
        """Index lists with each boolean mask replaced by the long indices of an all-true mask of its shape (what
        nonzero would give): on meta only their shapes matter."""
        out = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                out += [torch.empty(index.numel(), dtype=torch.long, device=index.device)] * max(index.dim(), 1)
            else:
                out.append(index)
        return out

    def _stand_in(self, func, args, kwargs):
        """The result of a data-sized op, as if every mask were all true, every element distinct and every
        repeat 1."""
        x = args[0]
        if func is aten.nonzero.default:
            values = torch.ones(x.shape, dtype=torch.bool).nonzero()
            return self.remember(values.to(DEVICE), values)
        if func is aten.masked_select.default:
            shape = torch.broadcast_shapes(x.shape, args[1].shape)
            return x.new_empty(torch.Size(shape).numel())
        if func is aten.repeat_interleave.Tensor:
            return x.new_empty(x.numel())
        if func is aten.bincount.default:
            minlength = kwargs.get("minlength", args[2] if len(args) > 2 else 0)
            bins = max(minlength, 1)
            counts = torch.full((bins,), x.numel() // bins, dtype=torch.long)
            counts[: x.numel() % bins] += 1
            weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
            dtype = torch.long if weights is None else weights.dtype
            return self.remember(counts.to(dtype).to(DEVICE), counts.to(dtype))
        if func in (aten.equal.default, aten.allclose.default):  # a Python bool, taken as True
            return True
        # unique: every element taken as distinct; _unique returns (output, inverse), the others add counts
        n, long = x.numel(), dict(dtype=torch.long, device=x.device)
        out = (x.new_empty(n), torch.empty(x.shape, **long), torch.empty(n, **long))
        return out[:2] if func is aten._unique.default else out

    # -------------------------------------------------------------- the dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = _tensors((args, kwargs))
        if any(_on_device(t) for t in tensors):
            self.op_counts[str(func.overloadpacket.__name__)] += 1
        if func is aten._local_scalar_dense.default and _on_device(args[0]):  # .item(), .tolist(), bool(), int()
            self.log("d2h", func)
            return self._read_back(args[0]).item()
        if func in _SIZED_BY_DATA and _on_device(args[0]) and kwargs.get("output_size") is None:
            self.log("d2h", func)
            return self._stand_in(func, args, kwargs)
        if func in _INDEX | _INDEX_PUT and _on_device(args[0]) and any(
                isinstance(i, torch.Tensor) and not _on_device(i) for i in args[1]):
            self.log("h2d", func)  # host indices (a Python list, a CPU tensor): CUDA copies them over first
        if func in _INDEX and _on_device(args[0]) and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            self.log("d2h", func)  # a boolean mask index: CUDA runs nonzero on the mask first
            return func(args[0], self._mask_as_all_true(args[1]))
        if func in _INDEX_PUT and _on_device(args[0]) and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            # x[mask] = v: CUDA turns it into masked_fill_ (no sync) for a one-element v (a Python number);
            # any other v needs nonzero of the mask
            if args[2].numel() != 1:
                self.log("d2h", func)
            return func(args[0], self._mask_as_all_true(args[1]), *args[2:], **kwargs)
        if func in _COPIES:
            src, dst_device = (args[0], kwargs.get("device")) if func is aten._to_copy.default else (args[1],
                                                                                                    args[0].device)
            if dst_device is not None and src.device.type != "meta" and torch.device(dst_device).type == "meta":
                # host -> device: PyTorch waits for the stream after a copy unless non_blocking=True; a
                # non_blocking copy is listed apart (from pageable memory the driver still stages it on the host)
                if kwargs.get("non_blocking", args[2:3] == (True,)):
                    self.copies.append(("h2d" if src.is_pinned() else "h2d pageable", str(func), call_site()))
                else:
                    self.log("h2d", func)
            elif dst_device is not None and src.device.type == "meta" and torch.device(dst_device).type != "meta":
                self.log("d2h", func)  # .cpu(), .tolist(), .numpy() of a device tensor
                host = self._read_back(src, kwargs.get("dtype"))
                return host if func is aten._to_copy.default else args[0].copy_(host)
        result = func(*args, **kwargs)
        if func in _CHECKS and _on_device(result) and result.dim() == 0:
            self.remember(result, torch.tensor(_CHECKS[func]))  # read back: the check passes
        return result


class _Built(TorchFunctionMode):
    """The Python-level half: torch.tensor / as_tensor / Tensor.new_tensor build a host tensor from Python data
    and copy it to the device below the dispatcher's view, so they are caught here by their target device."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        logged = len(self.recorder.syncs)
        result = func(*args, **kwargs)
        if func in (torch.tensor, torch.as_tensor, torch.Tensor.new_tensor) and _on_device(result):
            data = args[1] if func is torch.Tensor.new_tensor else (args[0] if args else kwargs.get("data"))
            if len(self.recorder.syncs) == logged:  # a tensor's or an array's copy is seen by the dispatch half
                self.recorder.log("h2d", f"{func.__name__} from Python data")
                with contextlib.suppress(Exception):
                    self.recorder.remember(result, torch.tensor(data, dtype=result.dtype))
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _on_device(args[0]) and any(
                isinstance(i, list) for i in (args[1] if isinstance(args[1], tuple) else (args[1],))):
            self.recorder.log("h2d", f"{func.__name__} with a Python list")  # the list becomes a device tensor
        return result


@contextlib.contextmanager
def record_host_syncs():
    """Record, for the code run inside (on the meta device), the host syncs it would make on CUDA and its op
    counts: yields the HostSyncRecorder (.syncs, .op_counts, .count(kind))."""
    recorder = HostSyncRecorder()
    with _meta_shims(), _Built(recorder), recorder:
        yield recorder


class _Generator(torch.Generator):
    """torch.Generator while recording: a CPU one asked for meta, which has none (its draws are never read)."""

    def __new__(cls, device="cpu"):
        return super().__new__(cls, "cpu" if str(device) == DEVICE.type else device)

    def __init__(self, device="cpu"):
        super().__init__()


@contextlib.contextmanager
def _meta_shims():
    """What meta lacks, while recording: autocast keeps no state for it and asking raises (it reads as off, as a
    GPU run without --use_amp), and it has no random generator (_Generator)."""
    enabled, dtype, generator = torch.is_autocast_enabled, torch.get_autocast_dtype, torch.Generator
    torch.is_autocast_enabled = lambda *device: False if device and str(device[0]) == DEVICE.type else enabled(*device)
    torch.get_autocast_dtype = lambda device: dtype("cuda" if str(device) == DEVICE.type else device)
    torch.Generator = _Generator
    try:
        yield
    finally:
        torch.is_autocast_enabled, torch.get_autocast_dtype, torch.Generator = enabled, dtype, generator


def summary(recorder):
    """The recorded syncs as lines 'kind op at call site (xN)', each distinct one once with its count."""
    return [f"{kind} {op} at {site} (x{n})" for (kind, op, site), n in Counter(recorder.syncs).items()]
