"""pytest's setup for every folder of pyproject's testpaths: tests/ and each release's own tests
(models/foundation/<release>/tests/), which run under tests/conftest.py's setup and import tests/ (helpers.py,
test_foundation.py's RELEASES) as tests/ itself does."""
import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("tests_setup", Path(__file__).resolve().parent / "tests" / "conftest.py")
_SETUP = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_SETUP)  # puts the repository root and tests/ on sys.path

# Under tests/, tests/conftest.py's own hook and fixture stand in for these (same names): they do the same.
pytest_configure = _SETUP.pytest_configure
launch_variables_untouched = _SETUP.launch_variables_untouched
