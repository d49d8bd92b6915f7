"""The GPU tier (python -m pytest -m gpu): every test under tests/gpu is marked `gpu`, and is skipped with a
reason where there is no CUDA device, or fewer GPUs than its `gpus(n)` mark asks for.

Its tests start real torchrun jobs (fresh interpreters, nccl, one GPU per process) and compare numbers, so
they take minutes. In the plain suite on a CPU-only machine the tier is skipped; but `-m gpu` itself, asked for
where torch has no CUDA, is a usage error (one line, exit 4): a GPU check that skips everything must not pass.
"""
import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
NO_CUDA = "no CUDA device here: the GPU tier needs one (python -m pytest -m gpu on a GPU machine)"
HIDDEN = "GPU tier: python -m pytest -m gpu on a GPU machine (the plain suite runs on the CPU, GPUs hidden)"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpus(n): needs at least n CUDA GPUs; skipped with a reason on fewer")


def _asks_for_the_gpu_tier(markexpr):
    """Whether a -m expression selects the GPU tier's tests and leaves the plain suite's out ("gpu", "gpu and
    not slow", ...), judged by pytest's own expression parser."""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression

    expression = Expression.compile(markexpr)

    def selects(marks):
        return expression.evaluate(lambda name, **kwargs: name in marks)

    return selects({"gpu"}) and not selects(set())


def _under_this_folder(item):
    return HERE in Path(str(item.path)).resolve().parents


@pytest.hookimpl(tryfirst=True)  # before `-m gpu` selects by marker (_pytest.mark's own modifyitems)
def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if _under_this_folder(item)]
    if not ours:
        return
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    if not cuda and _asks_for_the_gpu_tier(config.option.markexpr):
        raise pytest.UsageError(f"-m {config.option.markexpr!r} runs the GPU tier, but torch {torch.__version__} "
                                f"sees no CUDA device (torch.version.cuda {torch.version.cuda}, CUDA_VISIBLE_DEVICES="
                                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): run it on a GPU machine")
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        if not cuda:
            item.add_marker(pytest.mark.skip(reason=HIDDEN if os.environ.get("TSL_TESTS_HIDE_GPUS") else NO_CUDA))
            continue
        needed = max((int(mark.args[0]) for mark in item.iter_markers("gpus")), default=1)
        if count < needed:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {needed} CUDA GPUs, this machine has {count}: run it where "
                       f"torch.cuda.device_count() >= {needed}"))
