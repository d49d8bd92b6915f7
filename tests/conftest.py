import os
import re
import sys
from pathlib import Path

# The one place tests edit sys.path: the project's packages (run, exp, models, ...) from the repository
# root and the shared helpers (helpers.py) from tests/. Ranks that helpers.run_on_ranks spawns inherit it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

HIDDEN_GPUS = "TSL_TESTS_HIDE_GPUS"


def pytest_configure(config):
    """The CPU suite is the same on every machine: its multi-process runs are gloo runs on the CPU (on a
    1-GPU machine its 2-process runs would all take GPU 0), so it hides the GPUs; the GPU tier
    (python -m pytest -m gpu) sees them."""
    if not re.search(r"(?<!not )\bgpu\b", config.option.markexpr or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ[HIDDEN_GPUS] = "1"
