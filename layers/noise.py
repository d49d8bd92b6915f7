"""Random numbers a model draws for itself (a sampler's noise, a flow-matching step's noise and time), drawn so
that they follow the window rather than the process or the batch, as dropout's masks do (layers/dropout.py).

    from layers import noise
    eps = noise.randn(rows, *shape, device=x.device)   # rows: the forward's batch rows, window-major

`rows` is a multiple of the windows in the forward (B windows of k rows each, in window order: [B * C * S, ...]
for C channels of S samples each). Window b's k rows come from a generator seeded with its own key:

- in training, inside the experiment's masks_follow_samples: (run seed, epoch, the draw's call number in the
  forward, the window's position in the epoch's global order), so fine-tuning draws the same numbers for a window
  whichever process trains it and however its global batch is cut;
- in evaluation, inside draws_follow_windows(keys) (the experiment opens it around each batch with
  utils.probabilistic.window_keys: seed, split, the window's number in the split): (the window's key, call
  number), so samples and every metric are the same on any number of processes and at any batch size;
- elsewhere (a model used on its own): torch.randn / torch.rand from the global generator.

Each draw is a loop over the windows (a reseed and one draw each): cheap beside a model's forward."""
import contextlib

import torch

from layers import dropout
from utils.keyed_random import call_key, generator_seed

_window_keys = None  # the evaluation batch's per-window keys (a list of ints), or None


class _WindowKeys:
    """The batch's window keys, computed at the first draw (`keys` a list, or a function giving it): a model
    that draws nothing costs the evaluation loop no key."""

    def __init__(self, keys):
        self._keys, self.calls = keys, 0

    @property
    def keys(self):
        if callable(self._keys):
            self._keys = list(self._keys())
        return self._keys


@contextlib.contextmanager
def draws_follow_windows(keys):
    """Within it, randn / rand draw window b's rows from keys[b] (module docstring); `keys` a list, or a
    function returning it when the first draw asks."""
    global _window_keys
    previous, _window_keys = _window_keys, _WindowKeys(keys)
    try:
        yield
    finally:
        _window_keys = previous


def keyed():
    """Whether draws are keyed by window now (training steps or evaluation batches the experiment opened)."""
    return dropout.keyed() or _window_keys is not None


def randn(rows, *shape, device=None, dtype=torch.float32):
    """[rows, *shape] standard normal numbers, window b's rows from its key (module docstring)."""
    return _draw(torch.randn, rows, shape, device, dtype)


def rand(rows, *shape, device=None, dtype=torch.float32):
    """[rows, *shape] uniform numbers on [0, 1), window b's rows from its key (module docstring)."""
    return _draw(torch.rand, rows, shape, device, dtype)


def _draw(sampler, rows, shape, device, dtype):
    seeds = _window_seeds()
    if seeds is None:
        return sampler((rows, *shape), device=device, dtype=dtype)
    if not seeds or rows % len(seeds):
        raise RuntimeError(f"{rows} rows of random numbers cannot follow the batch's {len(seeds)} windows: draw "
                           "a multiple of the windows, window-major (layers/noise.py)")
    generator = dropout._generator(torch.device(device) if device is not None else torch.device("cpu"))
    per_window = rows // len(seeds)
    out = torch.empty((rows, *shape), device=device, dtype=dtype)
    for part, seed in zip(out.split(per_window), seeds):
        generator.manual_seed(seed)
        part.copy_(sampler((per_window, *shape), generator=generator, device=device, dtype=dtype))
    return out


def _window_seeds():
    """This draw's seed for each window of the forward (the call counted), or None when draws are not keyed."""
    if dropout.keyed():  # a training step: the dropout keys' stream, so draws and masks never share a key
        keys = dropout._keys
        return dropout._sample_seeds(dropout._next_call_key(keys), keys.first, keys.samples)
    if _window_keys is None:
        return None
    call, _window_keys.calls = _window_keys.calls, _window_keys.calls + 1
    return [generator_seed(call_key(key, call)) for key in _window_keys.keys]
