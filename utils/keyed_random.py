"""Keyed randomness: splitmix64 and the keys every draw of a run is seeded from.

A key is a 64-bit integer that names one stream of random numbers by what the numbers are for: the run's seed,
the epoch or split, the draw's call number in a forward, the sample's position (its place in the epoch's global
order in training, its window number in the split in evaluation). Each part is folded in with splitmix64, so
nearby inputs give unrelated keys; a key turned into a generator seed (`generator_seed`) or hashed with an
element's index gives that stream's numbers.

Draws follow the sample, not the rank: the rank, the number of processes and the way a global batch is cut into
micro-batches appear in no key, so a window gets the same dropout masks, the same noise and the same sampled
forecasts on one process as on sixteen, and a run's numbers do not depend on its world size. The shuffled order
of an epoch (data_provider.permutation) is keyed the same way, by the seed and the epoch alone.

splitmix64 (Steele, Lea and Flood's SplittableRandom) is written here once in the three forms its callers need:
on Python integers, on numpy uint64 arrays (the finaliser alone), and on torch int64 tensors in place.
"""
import numpy as np

# splitmix64's increment (the golden ratio's 64-bit fraction) and its finaliser's two factors
GOLDEN_GAMMA, FACTOR_1, FACTOR_2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = 0xFFFFFFFFFFFFFFFF
_FACTOR_1_UINT64, _FACTOR_2_UINT64 = np.uint64(FACTOR_1), np.uint64(FACTOR_2)


def splitmix64(x):
    """splitmix64's increment and finaliser: a well-mixed 64-bit integer from any integer."""
    x = (x + GOLDEN_GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * FACTOR_1) & _MASK64
    x = ((x ^ (x >> 27)) * FACTOR_2) & _MASK64
    return x ^ (x >> 31)


def splitmix64_finaliser(x):
    """splitmix64's finaliser alone (no increment) on numpy uint64 values: a bijective scramble, wrapping
    arithmetic (array arithmetic wraps modulo 2^64 without warnings)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _FACTOR_1_UINT64
    x = x ^ (x >> np.uint64(27))
    x = x * _FACTOR_2_UINT64
    return x ^ (x >> np.uint64(31))


def signed64(x):
    """A 64-bit pattern as the int64 that holds it (what a torch int64 tensor takes)."""
    return x - (1 << 64) if x >= 1 << 63 else x


def splitmix64_(x):
    """splitmix64 on an int64 tensor, in place (products wrap modulo 2**64; shifts masked to be logical)."""
    x.add_(signed64(GOLDEN_GAMMA))
    for shift, factor in ((30, FACTOR_1), (27, FACTOR_2), (31, None)):
        x.bitwise_xor_((x >> shift) & ((1 << (64 - shift)) - 1))
        if factor:
            x.mul_(signed64(factor))
    return x


def call_key(key, call):
    """The key of a forward's `call`-th keyed draw under `key` (a dropout mask, a model's noise)."""
    return splitmix64(key ^ splitmix64(call))


def generator_seed(key):
    """A 64-bit key as a torch.Generator seed: its top 63 bits, below 2**63."""
    return key >> 1
