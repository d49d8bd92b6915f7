"""Atomic file writes: every file this codebase writes goes through `atomic_write`.

A crash or a kill mid-write leaves the previous file (or none), never half of one.
"""
import os
import tempfile


def atomic_write(path, write, binary=True):
    """Call write(f) on a temp file in `path`'s folder, fsync it, then rename it over `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path
