"""Shuffled training order in O(1) memory: a seeded bijection of [0, n).

torch.randperm(n) every epoch on every rank costs 8 bytes per window, 8 GB for a corpus of a
billion windows. Here the order is a function: position p of an epoch is window
`FeistelPermutation(n, key)(p)`, computed for one batch of positions at a time, so an epoch's
order costs nothing to hold and a position within an epoch is one integer. Training deals it in
world-size-independent global batches (data_provider.global_batches.GlobalBatches);
ShuffledShards is the older round-robin share of the same order (DistributedSampler's dealing).
"""
import numpy as np

from utils.keyed_random import GOLDEN_GAMMA, splitmix64_finaliser

_GOLDEN = np.uint64(GOLDEN_GAMMA)


class FeistelPermutation:
    """A keyed pseudo-random bijection of [0, n): a balanced Feistel network on the smallest domain of
    2^(2h) >= n values, with cycle walking (a value that lands at n or above is encrypted again until
    it falls inside, which keeps the map a bijection of [0, n)); at most 4 walks on average."""

    ROUNDS = 6

    def __init__(self, n, key):
        if n < 1:
            raise ValueError(f"a permutation of {n} items")
        self.n = int(n)
        self.half = max(1, (int(n - 1).bit_length() + 1) // 2)  # bits of each half
        self.mask = np.uint64((1 << self.half) - 1)
        round_keys = np.arange(self.ROUNDS, dtype=np.uint64) + np.full(self.ROUNDS, key % 2**64, dtype=np.uint64) * _GOLDEN
        self.keys = splitmix64_finaliser(round_keys)  # array arithmetic: wraps modulo 2^64 without warnings

    def _encrypt(self, x):
        shift = np.uint64(self.half)
        left, right = x >> shift, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (splitmix64_finaliser(right ^ key) & self.mask)
        return (left << shift) | right

    def __call__(self, positions):
        """The windows at `positions` (integers in [0, n)), as an int64 array."""
        x = np.asarray(positions, dtype=np.uint64)
        out = self._encrypt(x)
        outside = out >= self.n
        # A bijection's cycle leaves [0, n) for at most domain - n steps; walking longer means the
        # round function is broken, and an error beats looping for ever.
        for _ in range((1 << 2 * self.half) - self.n):
            if not outside.any():
                break
            out[outside] = self._encrypt(out[outside])
            outside = out >= self.n
        if outside.any():
            raise RuntimeError("FeistelPermutation: cycle walking did not return into [0, n); "
                               "the map is not a bijection")
        return out.astype(np.int64)


def epoch_key(seed, epoch):
    """The permutation key of one epoch of one run: new every epoch, the same on every rank."""
    return int(splitmix64_finaliser(np.array([seed * 1_000_003 + epoch], dtype=np.uint64))[0])


class ShuffledShards:
    """This rank's share of a freshly shuffled [0, n) each epoch, in O(1) memory (DistributedSampler's
    semantics: rank r takes positions r, r + w, r + 2w, ... of the epoch's order, padded by wrapping to
    the front so that every rank takes the same number; `set_epoch` reshuffles)."""

    def __init__(self, n, seed, rank=0, world_size=1):
        self.n, self.seed, self.rank, self.world_size = n, seed, rank, world_size
        self.per_rank = -(-n // world_size) if n else 0
        self.set_epoch(0)

    def set_epoch(self, epoch):
        self.epoch = epoch
        self._order = FeistelPermutation(self.n, epoch_key(self.seed, epoch)) if self.n else None

    def __len__(self):
        return self.per_rank

    def indices(self, start, stop):
        """Windows of this rank's positions [start, stop) of the epoch, as an int64 array."""
        stop = min(stop, self.per_rank)
        if start >= stop:
            return np.zeros(0, dtype=np.int64)
        positions = (np.arange(start, stop, dtype=np.int64) * self.world_size + self.rank) % self.n
        return self._order(positions)

    def __iter__(self):
        step = 1 << 16
        for start in range(0, self.per_rank, step):
            yield from self.indices(start, start + step).tolist()
