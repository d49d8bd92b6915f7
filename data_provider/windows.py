"""Windows: where a window's input and target lie, every window of a split, and this rank's batches.

A split lives as one contiguous tensor; a window is a slice of it, and a batch of windows
is gathered in one indexing operation (`__getitems__`), so the loader does no per-window
Python work and no collation.

Sharding under DDP:
- train (TrainLoader): global batches that do not depend on the world size
  (data_provider.global_batches.GlobalBatches): one seeded order per epoch, step k takes its k-th
  chunk of batch_size x world_size x accumulation_steps windows, and each rank a contiguous part
  of it, cut into micro-batches; nothing padded or repeated;
- val/test (WindowLoader): each rank takes a contiguous, unpadded share of whole evaluation batches
  (ShardSampler), so every window is scored exactly once, no loader drops any, and each batch holds the
  windows it holds on one process (a model that reads its batch-mates, TSLib's TimesNet, scores alike on
  any number of processes at the same --eval_batch_size).
"""
import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from utils import distributed
from utils.errors import UserError


@dataclass
class Window:
    """Where a window's input and target lie, relative to the window's first row."""

    x_len: int
    y_offset: int
    y_len: int

    @property
    def span(self):
        return max(self.x_len, self.y_offset + self.y_len)


class WindowDataset(Dataset):
    """Every window of one split: item i is (x, y, x_mark, y_mark) starting at row i."""

    def __init__(self, values, marks, window, split, with_marks=True, original=None):
        self.window = window
        self.split = split
        self.with_marks = with_marks  # False: batches carry None for the marks (a model that reads none)
        self.n_windows = len(values) - window.span + 1
        # original: [rows, k] float64, the file's own values of the scored columns (--inverse), or None
        original = None if original is None else torch.from_numpy(np.ascontiguousarray(original))
        self._store(torch.from_numpy(np.ascontiguousarray(values)), torch.from_numpy(np.ascontiguousarray(marks)),
                    original)

    def _store(self, data, marks, original):
        self.data, self.marks, self.original = data, marks, original
        # [n_windows, length, C] views of the series (no copy) for the input and the target
        # part of every window: a batch is one gather per tensor, contiguous as gathered.
        w, n = self.window, len(self)

        def windows(series, offset, length):
            return series[offset:].unfold(0, length, 1).transpose(1, 2)[:n] if n else None

        self._parts = (windows(data, 0, w.x_len), windows(data, w.y_offset, w.y_len))
        self._parts += ((windows(marks, 0, w.x_len), windows(marks, w.y_offset, w.y_len)) if self.with_marks
                        else (None, None))
        self._original_targets = None if original is None else windows(original, w.y_offset, w.y_len)

    def __len__(self):
        return max(self.n_windows, 0)

    def to(self, device):
        """Keep the split on `device` (a GPU): batches are then gathered there."""
        self._store(self.data.to(device), self.marks.to(device),
                    None if self.original is None else self.original.to(device))
        return self

    @property
    def device(self):
        """Where batches are gathered, hence where their indices should be."""
        return self.data.device

    def __getitems__(self, indices):
        """A whole batch in one gather: [B, x_len, C], [B, y_len, C] and their marks."""
        starts = torch.as_tensor(indices, dtype=torch.long, device=self.data.device)
        return tuple(None if part is None else part[starts] for part in self._parts)

    def original_targets(self, indices):
        """[B, y_len, k] float64: the target part of windows `indices` as the data file holds it (what
        --inverse scores against), gathered as __getitems__ gathers the batch."""
        starts = torch.as_tensor(indices, dtype=torch.long, device=self.data.device)
        return self._original_targets[starts]

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        return tuple(None if t is None else t[0] for t in self.__getitems__([index]))


class WindowSelection(Dataset):
    """Item i is window `indices[i]` of `base` (a WindowDataset or another selection), still one
    gather per batch: for windows that must skip positions (univariate series lie end to end and
    no window may run from one into the next) and for few-shot training (data_provider.few_shot)."""

    def __init__(self, base, indices):
        indices = torch.as_tensor(indices, dtype=torch.long)
        if isinstance(base, WindowSelection):  # a selection of a selection: one level of indirection
            base, indices = base.base, base.indices[indices.to(base.indices.device)]
        self.base, self.indices = base, indices
        self.window, self.split = base.window, base.split

    def __len__(self):
        return len(self.indices)

    def to(self, device):
        self.base.to(device)
        self.indices = self.indices.to(device)
        return self

    @property
    def device(self):
        return self.indices.device

    def __getitems__(self, indices):
        """One index lookup, then the base's one gather per tensor."""
        chosen = torch.as_tensor(indices, dtype=torch.long, device=self.indices.device)
        return self.base.__getitems__(self.indices[chosen])

    def original_targets(self, indices):
        chosen = torch.as_tensor(indices, dtype=torch.long, device=self.indices.device)
        return self.base.original_targets(self.indices[chosen])

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        return tuple(None if t is None else t[0] for t in self.__getitems__([index]))


def pinned(batch):
    """A host batch in page-locked memory, so that its copy to a GPU (exp.forward.on_device, non_blocking) is
    queued on the stream instead of holding the host until the GPU has caught up."""
    return tuple(None if t is None else t.pin_memory() for t in batch)


def _identity(batch):
    return batch  # the dataset's __getitems__ already returns a stacked batch


class ShardSampler:
    """This rank's contiguous, unpadded share of range(n), in order: whole batches of `batch_size` (the
    last one short), so the batches cut from the shares are one process's batches, dealt out."""

    def __init__(self, n, batch_size=1):
        batches, rank, world = -(-n // batch_size), distributed.rank(), distributed.world_size()
        # shares of the batches differ by at most one, the larger first: rank 0 (which shows progress) has one
        first, last = -(-batches * rank // world), -(-batches * (rank + 1) // world)
        self.start, self.stop = min(first * batch_size, n), min(last * batch_size, n)

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self):
        return self.stop - self.start

    def indices(self, start, stop):
        """This rank's windows at positions [start, stop) of its share, as an int64 array."""
        return np.arange(self.start + start, self.start + min(stop, len(self)), dtype=np.int64)


class _StartAt:
    """A sampler's order from position `start` on (set before each pass; the workers' batch sampler
    runs in this process)."""

    def __init__(self, sampler):
        self.sampler, self.start = sampler, 0

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self):
        return max(len(self.sampler) - self.start, 0)


class WindowLoader:
    """This rank's batches of a WindowDataset, in the sampler's order (validation and test: its
    contiguous share, every window once).

    Without workers a batch is an index tensor cut from the epoch's order and gathered in
    one operation: no per-batch index lists, no collation. With --num_workers the same
    batches come from a torch DataLoader (workers gather them, into pinned memory for a GPU).
    """

    def __init__(self, dataset, sampler, batch_size, num_workers, pin_memory=False):
        self.dataset, self.sampler, self.batch_size, self.pin_memory = dataset, sampler, batch_size, pin_memory
        # pin_memory: batches land in page-locked memory (workers', or this process's), so the copy to the GPU
        # runs asynchronously: a copy from pageable memory makes the host wait for it
        self._worker_batches = BatchSampler(_StartAt(sampler), batch_size, drop_last=False)
        self._worker_loader = DataLoader(
            dataset, batch_sampler=self._worker_batches, collate_fn=_identity,
            num_workers=num_workers, persistent_workers=True, pin_memory=pin_memory,
            # its own generator: workers only gather (nothing random), and drawing their seed from the global
            # one would shift dropout's stream by a draw per pass, so a mid-epoch resume would differ
            generator=torch.Generator().manual_seed(0)) if num_workers > 0 else None

    def set_epoch(self, epoch):
        """Reshuffle a shuffling sampler's order (ShuffledShards'); a no-op for val/test."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def batch_indices(self, start=0):
        """The epoch's batches as index tensors from position `start` of this rank's share on (the last
        one may be short), on the data's device: one copy per epoch, not a blocking host-to-GPU copy
        before every batch. An O(1)-memory order (ShuffledShards) on host data gives its batches one at
        a time instead."""
        device, size = self.dataset.device, self.batch_size
        end = len(self.sampler)
        if isinstance(self.sampler, ShardSampler):  # a contiguous share: each batch a range made where it is read,
            # no index held for the split (a corpus-sized one) and nothing copied from the host
            first = self.sampler.start
            return (torch.arange(first + b, first + min(b + size, end), device=device) for b in range(start, end, size))
        if hasattr(self.sampler, "indices") and device.type == "cpu":
            return (torch.from_numpy(self.sampler.indices(b, min(b + size, end))) for b in range(start, end, size))
        order = torch.tensor(list(self.sampler), dtype=torch.long)[start:end].to(device)
        return order.split(size) if len(order) else ()  # a rank with no windows runs no batch

    def batch_positions(self, start=0):
        """The same batches as batch_indices, as int64 arrays on the host: what a window's host-side key (its number
        in the split) is read from, with no copy back from a split kept on the GPU."""
        size, end = self.batch_size, len(self.sampler)
        if hasattr(self.sampler, "indices"):  # ShardSampler's ranges, ShuffledShards' permutation
            return (self.sampler.indices(b, min(b + size, end)) for b in range(start, end, size))
        order = np.fromiter(self.sampler, dtype=np.int64)[start:end]
        return (order[b:b + size] for b in range(0, len(order), size))

    def batches(self, start=0):
        """The epoch's batches from position `start` of this rank's share on: a run resumed mid-epoch
        continues exactly where it stopped."""
        if self._worker_loader is not None:
            self._worker_batches.sampler.start = start
            return from_workers(self._worker_loader, self.dataset)
        batches = (self.dataset.__getitems__(indices) for indices in self.batch_indices(start))
        return map(pinned, batches) if self.pin_memory else batches

    def original_targets(self):
        """Each batch's original_targets (the data file's own values), in the order of the batches."""
        return (self.dataset.original_targets(indices) for indices in self.batch_indices())

    def __iter__(self):
        return self.batches()

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)


def from_workers(loader, dataset):
    """A DataLoader's batches, its workers' failures in this process's words. torch raises a worker's
    exception again here, its message the worker's whole traceback: a UserError's is its one line again.
    A worker killed by a signal (SIGBUS: it read a memory-mapped file cut short during the run) is reported
    as a RuntimeError about shared memory: a data set that can tell (a corpus: require_unchanged) names the
    file instead."""
    batches = iter(loader)
    try:
        yield from batches
    except UserError as problem:
        _stop_workers(batches)
        text = str(problem)
        if "\nOriginal Traceback" not in text:  # not a worker's (torch's ExceptionWrapper)
            raise
        # the traceback's last line: "utils.errors.UserError: <the one line>"
        raise type(problem)(text.rstrip().splitlines()[-1].split(": ", 1)[-1]) from None
    except RuntimeError:
        _stop_workers(batches)
        if hasattr(dataset, "require_unchanged"):
            dataset.require_unchanged()
        raise


def _stop_workers(batches):
    """Stop a failed loader's workers now. The run is about to end with one line, and its exit skips the
    interpreter's shutdown (utils.distributed.exit_process), where daemonic workers would be stopped: a worker
    still prefetching then meets its parent gone and prints a traceback of its own (ConnectionResetError while
    receiving a shared-memory handle) after the line."""
    shutdown = getattr(batches, "_shutdown_workers", None)  # torch's multi-process iterator
    if shutdown is not None:
        shutdown()


class _GatherSteps(Dataset):
    """For loader workers: item `step` (a GlobalStep of index tensors) is that step gathered."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitems__(self, step):
        return gather_step(self.dataset, step)


def gather_step(dataset, step):
    """A GlobalStep of index tensors gathered. A data set whose training windows are drawn anew each epoch
    (M4's cut points, data_provider.m4) is told the step's epoch first, in a loader worker too."""
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(step.epoch)
    return step.map(dataset.__getitems__)


class _StepsFrom:
    """A GlobalBatches' steps from position `start` on (set before each pass; the workers' batch
    sampler runs in this process)."""

    def __init__(self, sampler):
        self.sampler, self.start = sampler, 0

    def __iter__(self):
        return self.sampler.steps(self.start)

    def __len__(self):
        return self.sampler.steps_from(self.start)


class TrainLoader:
    """This rank's training steps: per optimizer step, a GlobalStep of gathered micro-batches
    (data_provider.global_batches.GlobalBatches' index tensors, one gather each).

    Without workers the indices are cut from the epoch's order on the data's device (one copy per
    epoch for an order held in memory). With --num_workers the same steps come from a torch
    DataLoader whose workers gather a whole step at a time (into pinned memory for a GPU).
    Iterating the loader itself gives the micro-batches one by one.
    """

    def __init__(self, dataset, sampler, num_workers=0, pin_memory=False):
        self.dataset, self.sampler, self.batch_size = dataset, sampler, sampler.batch_size
        self.pin_memory = pin_memory  # host batches for a GPU: pinned here when no worker does it (WindowLoader)
        if hasattr(dataset, "set_seed"):  # windows drawn from --seed (M4's), before any worker copies the data set
            dataset.set_seed(sampler.seed)
        self._worker_steps = _StepsFrom(sampler)
        self._worker_loader = DataLoader(
            _GatherSteps(dataset), batch_sampler=self._worker_steps, collate_fn=_identity,
            num_workers=num_workers, persistent_workers=True, pin_memory=pin_memory,
            # its own generator: workers only gather (nothing random), and drawing their seed from the global
            # one would shift dropout's stream by a draw per pass, so a mid-epoch resume would differ
            generator=torch.Generator().manual_seed(0)) if num_workers > 0 else None

    @property
    def steps_per_epoch(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        """The epoch's order: a function of --seed and the epoch alone."""
        self.sampler.set_epoch(epoch)

    def steps(self, start=0):
        """The epoch's steps from global position `start` of its order on (the windows every rank
        together took before a mid-epoch resume)."""
        if self._worker_loader is not None:
            self._worker_steps.start = start
            return from_workers(self._worker_loader, self.dataset)
        steps = (gather_step(self.dataset, step) for step in self.sampler.steps(start, self.dataset.device))
        return (step.map(pinned) for step in steps) if self.pin_memory else steps

    def batch_indices(self, start=0):
        """This rank's micro-batches of the epoch as index tensors, on the data's device."""
        return [indices for step in self.sampler.steps(start, self.dataset.device) for indices in step]

    def batch_positions(self, start=0):
        """The same micro-batches as int64 arrays on the host (WindowLoader.batch_positions), read back from
        batch_indices: only a check that evaluates the training split asks, never a training step."""
        return [indices.cpu().numpy() for indices in self.batch_indices(start)]

    def __iter__(self):
        """This rank's micro-batches, one by one (a stand-in is none)."""
        for step in self.steps():
            yield from step

    def __len__(self):
        """This rank's micro-batches in an epoch (what iterating the loader gives)."""
        return self.sampler.micro_batches()
