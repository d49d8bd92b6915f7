"""The CUDA path's costs that a CPU can show (issue 43, items 3-9): host syncs and blocking host-to-device copies
counted with a device stand-in (the "meta" device, which takes every copy and computes nothing), what auto
placement estimates and logs, evaluation indices in O(1) memory, TimesNet's index copies, and the GPU tier's
refusal to pass without CUDA. What only a GPU shows is checked by scripts/gpu_check.sh (docs/gpu.md)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from data_provider.global_batches import GlobalBatches


class HostTraffic(TorchDispatchMode):
    """Counts, for every op run under it: blocking copies to a non-CPU device (.to(device) without
    non_blocking: the host waits for the device's stream), reads of a value back (.item(), .tolist()) and
    tensors made from host data (torch.tensor(list), indexing with a Python list): each a host-to-device copy
    on a GPU."""

    def __init__(self):
        super().__init__()
        self.blocking_copies = self.reads = self.from_host = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default:
            device = kwargs.get("device")
            if device is not None and torch.device(device).type != "cpu" and not kwargs.get("non_blocking"):
                self.blocking_copies += 1
        elif func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        elif func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            self.from_host += 1
        return func(*args, **kwargs)


def test_training_order_reaches_the_device_without_a_blocking_copy_per_step():
    """Item 3: the O(1)-memory Feistel order (univariate and corpus data) is computed on the host each step; its
    copy to the device must be queued (pinned, non_blocking), not a .to(device) that waits for the GPU. The
    randperm order of table data likewise, once an epoch."""
    for constant_memory in (True, False):
        batches = GlobalBatches(1000, 7, 16, accumulation_steps=2, constant_memory=constant_memory)
        batches.set_epoch(3)
        with HostTraffic() as traffic:
            steps = list(batches.steps(device="meta"))
        assert len(steps) == 32 and all(m.device.type == "meta" for step in steps for m in step)
        assert (traffic.blocking_copies, traffic.reads) == (0, 0), constant_memory


def test_evaluation_indices_are_ranges_not_a_list_of_every_window():
    """Item 7: a validation or test share is contiguous, so each batch's indices are a range made on the data's
    device; no Python list (or tensor) of every window is built, however large the split (a corpus's)."""
    import tracemalloc
    from types import SimpleNamespace

    from data_provider.windows import ShardSampler, WindowLoader

    n, size = 3_000_000, 1000
    loader = WindowLoader(SimpleNamespace(device=torch.device("meta")), ShardSampler(n), size, num_workers=0)
    torch.arange(0, 10, device="meta")  # what the first meta op imports is not the loader's
    tracemalloc.start()
    try:
        batches = loader.batch_indices(start=2000)
        first = next(iter(batches))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first.shape == (size,) and first.device.type == "meta"
    assert peak < 1 << 20, f"{peak / 2**20:.0f} MiB held to start the evaluation of {n} windows"
    on_cpu = WindowLoader(SimpleNamespace(device=torch.device("cpu")), ShardSampler(2500), 1000, num_workers=0)
    assert [b.tolist() for b in on_cpu.batch_indices(start=1200)] == [list(range(1200, 2200)), list(range(2200, 2500))]
