import sys
from pathlib import Path

# Tests import the project's packages (run, exp, models, ...) from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
