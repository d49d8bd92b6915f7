"""A chosen subset of a window data set that is still gathered in one operation per batch.

Used for windows that must skip positions (univariate series stored end to end, where a
window may not run from one series into the next) and for few-shot training on a random
fraction of the training windows (`--subset_rand_ratio`).
"""
import torch
from torch.utils.data import Dataset

from utils.errors import require


class WindowSelection(Dataset):
    """Item i is window `indices[i]` of `base` (a WindowDataset or another selection)."""

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

    def __getitems__(self, indices):
        """One index lookup, then the base's one gather per tensor."""
        chosen = torch.as_tensor(indices, dtype=torch.long, device=self.indices.device)
        return self.base.__getitems__(self.indices[chosen])

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        return tuple(None if t is None else t[0] for t in self.__getitems__([index]))


def subset_size(n_windows, ratio):
    """round(ratio x n_windows), at least one window (when there is any)."""
    return min(n_windows, max(1, round(n_windows * ratio))) if n_windows else 0


def check_subset_ratio(ratio):
    require(0 < ratio <= 1, f"--subset_rand_ratio must be in (0, 1] (the fraction of training windows kept), got {ratio}")


def few_shot_subset(dataset, ratio, seed):
    """A random `ratio` of the windows, chosen from `seed` alone: every rank picks the same
    subset before DistributedSampler shards it. Kept in time order; ratio 1 keeps all."""
    check_subset_ratio(ratio)
    if ratio == 1 or len(dataset) == 0:
        return dataset
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(dataset), generator=generator)[:subset_size(len(dataset), ratio)]
    return WindowSelection(dataset, chosen.sort().values)
