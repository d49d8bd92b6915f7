import sys
from pathlib import Path

# The one place tests edit sys.path: the project's packages (run, exp, models, ...) from the repository
# root and the shared helpers (helpers.py) from tests/. Ranks that helpers.run_on_ranks spawns inherit it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
