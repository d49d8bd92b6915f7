"""The training order, in global batches that do not depend on the number of processes.

Each epoch the training windows are put in ONE seeded order, the same on every rank and any world
size: `torch.randperm(n)` from a generator seeded with `seed + epoch` for data held in memory (the
order a 1-process run has always had: torch's DistributedSampler with one replica), or, for the
corpus-scale kinds, `FeistelPermutation(n, epoch_key(seed, epoch))`, computed a batch at a time in
O(1) memory (data_provider.permutation).

Optimizer step k of an epoch takes the k-th consecutive chunk of that order, of
G = batch_size x world_size x accumulation_steps windows (the last chunk may be shorter):

    order:    | chunk 0 (step 1)             | chunk 1 (step 2)             | ... | short chunk |
    chunk:    | rank 0      | rank 1      | ... (contiguous parts, as even as possible)
    rank part:| micro 0 | micro 1 | ...     (accumulation_steps micro-batches, as even as possible)

Rank r's part of a chunk of g windows is positions [r g / W, (r + 1) g / W) (rounded down), and its
micro-batches cut that part alike; a full chunk gives every micro-batch exactly batch_size windows.
Nothing is padded and nothing repeated: every window is trained on exactly once per epoch, and the
union of the ranks' parts of step k is the same chunk on 1 process or many. With the loss of each
micro-batch weighted by world_size / (the chunk's scored elements) (Exp_Forecast.train_step), DDP's
gradient average is the mean over the whole chunk: the step a single process takes.

Every rank takes ceil(n / G) steps an epoch (floor(n / G) with drop_last, which drops the last short
chunk). A rank whose part of a short last chunk is empty still joins the step's all-reduce: its
step carries a `stand_in`, one real window of the chunk, for a pass that contributes nothing.
"""
import numpy as np
import torch

from data_provider.permutation import FeistelPermutation, epoch_key


def to_device_async(tensor, device):
    """`tensor` (in host memory) on `device` without blocking the host: on a GPU it is pinned first, so the copy
    is queued on the stream (the caching host allocator keeps the pinned block until the copy is done). A copy
    from pageable memory, or a plain .to(), would wait for the GPU every training step."""
    if device is None or torch.device(device).type == "cpu":
        return tensor
    if torch.device(device).type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class GlobalStep(list):
    """One optimizer step on this rank: the list of its micro-batches (index tensors from
    GlobalBatches, gathered batches from the training loader), with
      windows   the whole chunk's window count over every rank (g <= G);
      stand_in  when this rank's part is empty (the list is), one window of the chunk to run a
                zero-weighted pass on, so that the rank still joins DDP's all-reduce; else None;
      uneven    whether ranks run different numbers of forward passes in this step (only in a short
                last chunk): layers that synchronise in forward (SyncBatchNorm) must not then;
      epoch, firsts  the epoch, and each micro-batch's position of its first window in the epoch's
                order: what dropout masks are keyed by (layers.dropout.masks_follow_samples)."""

    def __init__(self, micro_batches, windows, stand_in=None, uneven=False, epoch=0, firsts=None):
        super().__init__(micro_batches)
        self.windows, self.stand_in, self.uneven = windows, stand_in, uneven
        self.epoch, self.firsts = epoch, firsts

    def map(self, gather):
        """The same step with `gather` applied to each micro-batch and to the stand-in."""
        return GlobalStep([gather(m) for m in self], self.windows,
                          None if self.stand_in is None else gather(self.stand_in), self.uneven, self.epoch,
                          self.firsts)


def even_cuts(size, parts):
    """[start, stop) bounds of `parts` consecutive pieces of range(size), as even as possible:
    piece i is [i * size // parts, (i + 1) * size // parts)."""
    return [(i * size // parts, (i + 1) * size // parts) for i in range(parts)]


class GlobalBatches:
    """This rank's share of every optimizer step of an epoch (see the module's docstring).

    n: training windows; batch_size: per micro-batch and process, or `global_batch` windows per step;
    `constant_memory`: the Feistel order (corpus-scale kinds) instead of randperm. `set_epoch(epoch)` chooses the epoch's order;
    `steps(start)` yields a GlobalStep of index tensors per optimizer step, from global position
    `start` of the order on (a resumed epoch: the windows done before it).
    """

    def __init__(self, n, seed, batch_size, accumulation_steps=1, rank=0, world_size=1, drop_last=False,
                 constant_memory=False, global_batch=None):
        self.n, self.seed, self.batch_size = n, seed, batch_size
        self.accumulation, self.rank, self.world_size = accumulation_steps, rank, world_size
        # G; given (--global_batch_size), the parts and micro-batches of every chunk are cut as evenly as possible
        self.global_batch = global_batch or batch_size * world_size * accumulation_steps
        self.drop_last, self.constant_memory = drop_last, constant_memory
        self.set_epoch(0)

    def set_epoch(self, epoch):
        self.epoch = epoch
        self._order = None  # randperm's order, drawn when first read
        self._feistel = None  # the corpus-scale kinds' order: a function, nothing held
        if self.constant_memory and self.n:
            self._feistel = FeistelPermutation(self.n, epoch_key(self.seed, epoch))

    def order(self, start, stop, device=None):
        """The windows at positions [start, stop) of this epoch's order, as an int64 tensor on `device`
        (randperm's order crosses to a device once per epoch, the Feistel one per call; both queued, never a
        blocking copy: to_device_async)."""
        if self._feistel is not None:
            return to_device_async(torch.from_numpy(self._feistel(np.arange(start, stop))), device)
        if self._order is None:  # DistributedSampler's draw for one replica: the same generator and call
            self._order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        if device is not None and self._order.device != torch.device(device):
            self._order = to_device_async(self._order, device)
        return self._order[start:stop]

    def _end(self, start):
        """Where the epoch's last step ends, for steps from position `start` on."""
        if self.drop_last:
            return start + (self.n - start) // self.global_batch * self.global_batch
        return self.n

    def __len__(self):
        """Optimizer steps in an epoch: ceil(n / G), or floor(n / G) with drop_last."""
        return self.steps_from(0)

    def steps_from(self, start):
        """Optimizer steps left in an epoch from position `start` on."""
        return -(-(self._end(start) - start) // self.global_batch) if start < self.n else 0

    def micro_batches(self):
        """This rank's micro-batches in an epoch (a stand-in is none), counted without the order."""
        full, short = divmod(self._end(0), self.global_batch)
        return full * self.accumulation + (self._forwards(short, self.rank) if short else 0)

    def part(self, chunk_windows, rank=None):
        """[start, stop) of a rank's part (this one's by default) within a chunk of `chunk_windows`."""
        return even_cuts(chunk_windows, self.world_size)[self.rank if rank is None else rank]

    def _forwards(self, chunk_windows, rank):
        """Training forward passes `rank` runs for a chunk: its non-empty micro-batches."""
        start, stop = self.part(chunk_windows, rank)
        return min(stop - start, self.accumulation)

    def steps(self, start=0, device=None):
        """A GlobalStep of index tensors (on `device`) per optimizer step from position `start` on."""
        for begin in range(start, self._end(start), self.global_batch):
            windows = min(self.global_batch, self.n - begin)
            first, last = self.part(windows)
            part = self.order(begin + first, begin + last, device)  # one read (one copy) per step
            cuts = [(a, b) for a, b in even_cuts(len(part), self.accumulation) if b > a]
            micro = [part[a:b] for a, b in cuts]
            stand_in = None if micro else self.order(begin, begin + 1, device)
            # a rank without a window runs one stand-in pass: only differing counts of passes are uneven
            uneven = windows < self.global_batch and len({max(1, self._forwards(windows, r))
                                                          for r in range(self.world_size)}) > 1
            yield GlobalStep(micro, windows, stand_in, uneven, self.epoch, [begin + first + a for a, _ in cuts])
