"""Few-shot training (--subset_rand_ratio): a random fraction of the training windows."""
import torch

from data_provider.windows import WindowSelection
from utils.errors import require


def subset_size(n_windows, ratio):
    """round(ratio x n_windows), at least one window (when there is any)."""
    return min(n_windows, max(1, round(n_windows * ratio))) if n_windows else 0


def check_subset_ratio(ratio):
    require(0 < ratio <= 1, f"--subset_rand_ratio must be in (0, 1] (the fraction of training windows kept), got {ratio}")


def few_shot_subset(dataset, ratio, seed):
    """A random `ratio` of the windows, chosen from `seed` alone: every rank picks the same
    subset before DistributedSampler shards it. Kept in time order; ratio 1 keeps all."""
    check_subset_ratio(ratio)
    if ratio == 1:
        return dataset
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(dataset), generator=generator)[:subset_size(len(dataset), ratio)]
    return WindowSelection(dataset, chosen.sort().values)
