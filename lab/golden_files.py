"""Write, or with --check compare, the committed files a reference script produces (tests/golden/...).

Standard library and numpy only: the reference scripts run in environments of their own (gluonts,
statsforecast) and import this module from beside them, nothing else of the repository.
"""
import sys

import numpy as np


def _same(path, content):
    if not path.exists():
        return False
    if isinstance(content, str):
        return path.read_text() == content
    with np.load(path) as stored:
        return set(stored) == set(content) and all(
            np.array_equal(stored[key], value, equal_nan=stored[key].dtype.kind in "fc")  # NaN gaps are data
            for key, value in content.items())


def write_or_check(files, check, compressed=True):
    """`files`: {path: JSON text or {name: array} for an .npz}. With `check`, say which differ and exit 1 if any
    does; else write only those that changed (an unchanged file keeps its bytes and time) and say which."""
    same = {path: _same(path, content) for path, content in files.items()}
    if check:
        print(", ".join(f"{path} {'unchanged' if same[path] else 'DIFFERS'}" for path in files))
        sys.exit(0 if all(same.values()) else 1)
    for path, content in files.items():
        if same[path]:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        else:
            (np.savez_compressed if compressed else np.savez)(path, **content)
    print(", ".join(f"{path} {'unchanged' if same[path] else 'written'}" for path in files))
