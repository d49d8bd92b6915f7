import logging
import os
import re
import sys
from pathlib import Path

import pytest

# The one place tests edit sys.path: the project's packages (run, exp, models, ...) from the repository
# root and the shared helpers (helpers.py) from tests/. Ranks that helpers.run_on_ranks spawns inherit it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

HIDDEN_GPUS = "TSL_TESTS_HIDE_GPUS"

# Under pytest-xdist (-n 2) two workers share the cores, and OpenMP's threads that spin at every barrier then wait
# a scheduler slice for each descheduled neighbour (utils/threads.py): each worker's in-process runs wait passively.
# Set before torch loads, which reads it once; it changes only the speed, never a number.
if os.environ.get("PYTEST_XDIST_WORKER") and "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config):
    """The CPU suite is the same on every machine: its multi-process runs are gloo runs on the CPU (on a
    1-GPU machine its 2-process runs would all take GPU 0), so it hides the GPUs; the GPU tier
    (python -m pytest -m gpu) sees them."""
    if not re.search(r"(?<!not )\bgpu\b", config.option.markexpr or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ[HIDDEN_GPUS] = "1"


# What makes an in-process run.main take itself for a rank of a job: a test that leaves one set changes every test
# after it (a later run.main ended pytest as "rank 1").
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def launch_variables_untouched():
    """Each test leaves the launcher's variables as it found them (monkeypatch's own are undone before this)."""
    before = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
    yield
    after = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
    changed = {name: (before[name], after[name]) for name in LAUNCH_VARIABLES if before[name] != after[name]}
    if changed:
        for name, (value, _) in changed.items():  # the next test starts clean either way
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        pytest.fail(f"the test left launcher variables changed (before, after): {changed}")


@pytest.fixture(autouse=True)
def tsl_logger_restored():
    """An in-process run.main configures the "tsl" logger (a stdout handler, propagate off): left so, a later
    test's caplog sees nothing and its handler writes to a closed capture. Each test gets the logger it found."""
    logger = logging.getLogger("tsl")
    before = logger.handlers[:], logger.propagate, logger.level
    yield
    logger.handlers[:], logger.propagate, logger.level = before[0], before[1], before[2]
