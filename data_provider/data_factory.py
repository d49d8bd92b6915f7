"""`data_provider(args, flag)` -> (dataset, loader), the entry point the experiment uses.

Sharding under DDP:
- train: DistributedSampler (shuffled, `set_epoch` every epoch; it pads the last
  batch with repeats, harmless for SGD and it keeps every rank's step count equal);
- val/test: each rank takes a contiguous, unpadded share of the windows, so every
  window is scored exactly once and no loader drops any.
"""
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from data_provider.data_loader import DATASETS, SPLITS, Window, WindowDataset, prepare
from data_provider.selection import few_shot_subset
from data_provider.univariate import UNIVARIATE, prepare_univariate
from utils import distributed
from utils.arguments import DATA_ARGS
from utils.errors import UserError, require

_prepared_cache = {}


def _cache_key(args):
    return tuple(getattr(args, k, None) for k in DATA_ARGS)


def prepared_data(args):
    """The scaled series of args' data set, read once per process."""
    known = DATASETS + (UNIVARIATE,)
    require(args.data in known, f"unknown --data '{args.data}'; choose one of {', '.join(known)} (custom reads any CSV or raw numeric file)")
    key = _cache_key(args)
    if key not in _prepared_cache:
        _prepared_cache.clear()
        _prepared_cache[key] = prepare_univariate(args) if args.data == UNIVARIATE else prepare(args)
    return _prepared_cache[key]


def window_for(args, flag):
    """Input/target layout of a window for the model family and split.

    Direct models (TSLib): x = seq_len rows, y = label_len + pred_len rows after x's
    first seq_len - label_len rows. Token models (OpenLTM): y holds the next
    output_token_len rows of every input token; at test time the model rolls out
    test_pred_len rows after a test_seq_len history.
    """
    if getattr(args, "autoregressive", False):
        if flag == "test":
            return Window(args.test_seq_len, args.test_seq_len, args.test_pred_len)
        return Window(args.seq_len, args.input_token_len, args.seq_len - args.input_token_len + args.output_token_len)
    return Window(args.seq_len, args.seq_len - args.label_len, args.label_len + args.pred_len)


def _identity(batch):
    return batch  # the dataset's __getitems__ already returns a stacked batch


class ShardSampler:
    """This rank's contiguous, unpadded share of range(n), in order."""

    def __init__(self, n):
        self.start, self.stop = distributed.shard_range(n)

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self):
        return self.stop - self.start


def data_provider(args, flag, device=None):
    """(dataset, loader) of one split. With a CUDA `device` and no loader workers the split
    lives on the GPU, so building a batch is one gather on the device and nothing crosses PCIe."""
    if flag not in SPLITS:
        raise ValueError(f"flag must be one of {SPLITS}, got {flag!r}")
    data = prepared_data(args)
    window = window_for(args, flag)
    if args.data == UNIVARIATE:
        dataset = data.window_dataset(flag, window)  # says itself when no series holds a window
    else:
        start, stop = data.split_rows(flag, window.x_len)
        reads_marks = "x_mark_enc" in args.model_inputs or "x_mark_dec" in args.model_inputs
        dataset = WindowDataset(data.values[start:stop], data.marks[start:stop], window, flag, with_marks=reads_marks)
    if flag == "train":  # few-shot: the same random windows on every rank, before DDP shards them
        dataset = few_shot_subset(dataset, args.subset_rand_ratio, args.seed)
    if device is not None and torch.device(device).type == "cuda" and args.num_workers == 0:
        dataset.to(device)
    if len(dataset) == 0:
        raise UserError(
            f"the {flag} split of {args.data} has {stop - start} rows, fewer than the {window.span} "
            f"one window needs (seq_len {window.x_len} + horizon); shorten --seq_len/--pred_len or use a longer series"
        )
    require(args.batch_size > 0, f"--batch_size must be positive, got {args.batch_size}")
    batch_size = args.batch_size
    if flag != "train":
        batch_size = args.eval_batch_size or 4 * args.batch_size
        require(batch_size > 0, f"--eval_batch_size must be positive, got {batch_size}")
    if flag == "train":
        sampler = DistributedSampler(
            dataset, num_replicas=distributed.world_size(), rank=distributed.rank(),
            shuffle=True, seed=args.seed, drop_last=False)
        # DistributedSampler gives every rank the same count, so every rank drops alike
        drop_last = args.train_drop_last
        require(not drop_last or len(sampler) >= batch_size,
                f"--train_drop_last leaves no training batch: each process holds {len(sampler)} training windows, "
                f"fewer than --batch_size {batch_size}; lower --batch_size or drop --train_drop_last")
    else:
        sampler, drop_last = ShardSampler(len(dataset)), False  # every window is scored
    return dataset, WindowLoader(dataset, sampler, batch_size, args.num_workers, drop_last)


class WindowLoader:
    """This rank's batches of a WindowDataset, in the sampler's order.

    Without workers a batch is an index tensor cut from the epoch's order and gathered in
    one operation: no per-batch index lists, no collation. With --num_workers the same
    batches come from a torch DataLoader (workers gather them).
    """

    def __init__(self, dataset, sampler, batch_size, num_workers, drop_last=False):
        self.dataset, self.sampler, self.batch_size, self.drop_last = dataset, sampler, batch_size, drop_last
        self._worker_loader = DataLoader(
            dataset, batch_sampler=BatchSampler(sampler, batch_size, drop_last=drop_last), collate_fn=_identity,
            num_workers=num_workers, persistent_workers=True) if num_workers > 0 else None

    def set_epoch(self, epoch):
        """Reshuffle the training order (DistributedSampler semantics); no-op for val/test."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def batch_indices(self):
        """The epoch's batches as index tensors (the last one may be short, unless drop_last)."""
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        if self.drop_last:
            order = order[:len(self) * self.batch_size]
        return order.split(self.batch_size) if len(order) else ()  # a rank with no windows runs no batch

    def __iter__(self):
        if self._worker_loader is not None:
            return iter(self._worker_loader)
        return (self.dataset.__getitems__(indices) for indices in self.batch_indices())

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return -(-len(self.sampler) // self.batch_size)
