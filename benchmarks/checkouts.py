"""Another checkout's packages imported in place of ours for a while: TSLib's and OpenLTM's `models`, `layers`
and `utils` have the same names as this repository's. The benchmarks that time TSLib's own code
(bench_models.py's `tslib` variant) and the cross-checks in lab/ import a checkout through it."""
import contextlib
import sys


@contextlib.contextmanager
def packages_from(root):
    """Import from `root` for the duration, then restore ours: TSLib's `models`, `layers` and
    `utils` packages have the same names as this repository's."""
    clashing = ("models", "layers", "utils")

    def ours():
        return {name: module for name, module in sys.modules.items() if name.split(".")[0] in clashing}

    saved = ours()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        for name in ours():
            del sys.modules[name]
        sys.modules.update(saved)
