"""`data_provider(args, flag)` -> (dataset, loader), the entry point the experiment uses (TSLib's name).

The data set is prepared once per process (`prepared_data`), as the class that --data names;
every kind (table.py, univariate.py, corpus.py) answers the interface of data_provider.interface.ForecastData.
"""
import logging

import numpy as np
import torch
from data_provider.competitions import COMPETITIONS, prepare_competition
from data_provider.corpus import CORPUS, prepare_corpus
from data_provider.few_shot import few_shot_subset
from data_provider.openltm_data import OPENLTM_DATA
from data_provider.global_batches import GlobalBatches
from data_provider.m4 import M4, prepare_m4
from data_provider.permutation import FeistelPermutation, epoch_key
from data_provider.splits import SPLITS
from data_provider.table import DATASETS, prepare_table
from data_provider.univariate import UNIVARIATE, prepare_univariate
from data_provider.windows import ShardSampler, TrainLoader, Window, WindowLoader, WindowSelection
from utils import distributed
from utils.arguments import DATA_ARGS
from utils.errors import require

logger = logging.getLogger("tsl")
_prepared_cache = {}


def _cache_key(args):
    # --inverse keeps the file's own values of the scored columns (TableData.original) beside the scaled ones
    return tuple(getattr(args, k, None) for k in DATA_ARGS + ("inverse",))


def prepared_data(args):
    """The scaled data of args' data set (a ForecastData), read once per process."""
    known = DATASETS + (UNIVARIATE, CORPUS, M4, *COMPETITIONS)
    require(args.data in known + tuple(OPENLTM_DATA),
            f"unknown --data '{args.data}'; choose one of {', '.join(known)} (custom reads any CSV or raw numeric file), "
            f"or OpenLTM's {', '.join(OPENLTM_DATA)}")
    key = _cache_key(args)
    if key not in _prepared_cache:
        _prepared_cache.clear()
        kind = OPENLTM_DATA[args.data].kind if args.data in OPENLTM_DATA else args.data  # OpenLTM's: table or univariate
        prepare = {UNIVARIATE: prepare_univariate, CORPUS: prepare_corpus, M4: prepare_m4,
                   **dict.fromkeys(COMPETITIONS, prepare_competition)}.get(kind, prepare_table)
        _prepared_cache[key] = prepare(args)
    return _prepared_cache[key]


def data_fingerprint(args):
    """What every rank must agree on before training: each split's window count and the prepared
    data's content hash. Two nodes with other copies of a file differ here."""
    data = prepared_data(args)
    counts = [f"{len(data.window_dataset(flag, window_for(args, flag), with_marks=False))} {flag}" for flag in SPLITS]
    return f"{' / '.join(counts)} windows, hash {data.content_hash()}"


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


AUTO_SHARE_OF_FREE_MEMORY = 0.25  # auto keeps the data on the GPU when it takes at most this share of its free memory
_placement_cache = {}


def keeps_data_on_device(args, device):
    """Whether the splits live on `device` (a GPU), so that a batch is one gather there and nothing
    crosses PCIe per step: --data_on_device always, or auto when there are no loader workers and
    the prepared data takes at most a quarter of the GPU's free memory (each rank decides for its
    own GPU; results are the same either way). Decided once per process and data set. Data read on the
    host (a corpus from its memory map, M4's cut windows: `stays_on_host`) never moves: off, and said so,
    whatever --data_on_device asks."""
    if device is None or torch.device(device).type != "cuda" or args.data_on_device == "never":
        return False
    key = (_cache_key(args), str(device))
    stays_on_host = getattr(prepared_data(args), "stays_on_host", None)  # a corpus, M4: read on the host
    if stays_on_host:
        if key not in _placement_cache:
            _placement_cache[key] = False
            logger.info(f"data off the GPU (--data_on_device {args.data_on_device}): {stays_on_host}; each step's "
                        "windows are read in host memory, pinned and copied asynchronously ("
                        + (f"{args.num_workers} loader workers read ahead)" if args.num_workers else
                           "read in this process; --num_workers N reads them ahead in parallel)"))
        return False
    if args.data_on_device == "always":
        return True
    if args.num_workers > 0:
        return False
    if key not in _placement_cache:
        needed = prepared_data(args).nbytes()
        free, _ = torch.cuda.mem_get_info(device)
        _placement_cache[key] = fits = needed <= AUTO_SHARE_OF_FREE_MEMORY * free
        logger.info(f"data {'on' if fits else 'off'} the GPU (--data_on_device auto): {needed / 2**20:.1f} MiB "
                    f"against {free / 2**20:.0f} MiB free on {device}"
                    + ("" if fits else "; batches are gathered in host memory, pinned and copied asynchronously "
                                       "(--num_workers N gathers them ahead in parallel)"))
    return _placement_cache[key]


class SeededSubset(WindowSelection):
    """`n` windows of an evaluation split drawn from `seed` alone (the first n positions of a seeded
    permutation, in time order): the same subset on every rank and world size, so the validation
    (--val_windows) or test (--test_windows) metrics stay exact; memory for n windows, none for the
    rest. `positions` are the chosen windows' numbers in the split, `split_windows` its size."""

    def __init__(self, split, n, seed):
        chosen = FeistelPermutation(len(split), epoch_key(seed, 0) ^ 0x7A11DA7E)(np.arange(n))  # not epoch 0's order
        self.positions, self.split_windows = np.sort(chosen), len(split)
        super().__init__(split, self.positions)


def split_numbering(dataset):
    """(each window's number in its split, the split's size): a SeededSubset's, or every window's."""
    if isinstance(dataset, SeededSubset):
        return dataset.positions, dataset.split_windows
    return np.arange(len(dataset)), len(dataset)


def data_provider(args, flag, device=None):
    """(dataset, loader) of one split: a TrainLoader of global-batch steps for "train" (data_provider.
    global_batches), a WindowLoader of this rank's contiguous share for "val" and "test". On a GPU the
    split lives there when keeps_data_on_device says so; otherwise batches are gathered in host memory
    (pinned, when workers gather them)."""
    if flag not in SPLITS:
        raise ValueError(f"flag must be one of {SPLITS}, got {flag!r}")
    reads_marks = "x_mark_enc" in args.model_inputs or "x_mark_dec" in args.model_inputs
    dataset = prepared_data(args).window_dataset(flag, window_for(args, flag), with_marks=reads_marks)
    if flag == "train":  # few-shot: the same random windows on every rank, before DDP shards them
        dataset = few_shot_subset(dataset, args.subset_rand_ratio, args.seed)
    subset = {"val": args.val_windows, "test": args.test_windows}.get(flag)
    if subset and subset < len(dataset):  # as many windows as the split holds, or more: all of them
        dataset = SeededSubset(dataset, subset, args.seed)
    on_device = keeps_data_on_device(args, device)
    if on_device:
        dataset.to(device)
    require(args.batch_size > 0, f"--batch_size must be positive, got {args.batch_size}")
    batch_size = args.batch_size
    if flag != "train":
        batch_size = args.eval_batch_size or 4 * args.batch_size
        require(batch_size > 0, f"--eval_batch_size must be positive, got {batch_size}")
    feeds_gpu = device is not None and torch.device(device).type == "cuda" and not on_device
    if flag == "train":  # one order and global batches for any world size; O(1) memory for corpus-scale kinds
        sampler = GlobalBatches(len(dataset), args.seed, batch_size, args.accumulation_steps, distributed.rank(),
                                distributed.world_size(), drop_last=args.train_drop_last,
                                constant_memory=prepared_data(args).constant_memory_shuffle,
                                global_batch=getattr(args, "global_batch", None))
        require(len(sampler) > 0,
                f"--train_drop_last leaves no training batch: {len(dataset)} training windows, fewer than one "
                f"global batch of {sampler.global_batch} (--batch_size {batch_size} x {distributed.world_size()} "
                f"processes x {args.accumulation_steps} accumulation steps); lower --batch_size or drop "
                "--train_drop_last")
        return dataset, TrainLoader(dataset, sampler, args.num_workers, pin_memory=feeds_gpu)
    sampler = ShardSampler(len(dataset), batch_size)  # every window is scored, in one process's batches
    return dataset, WindowLoader(dataset, sampler, batch_size, args.num_workers, pin_memory=feeds_gpu)
