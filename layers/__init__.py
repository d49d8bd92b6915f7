"""Reusable building blocks shared by the forecasting models.

The modules here are this codebase's own blocks, named for what they do. TSLib's modules, under TSLib's names
(layers.Embed, layers.SelfAttention_Family, ...), live in the subpackage layers.tslib; `from layers.Embed
import DataEmbedding`, as a TSLib model file writes it, still imports them: the finder below answers the name
layers.<TSLib's module> with the module layers.tslib.<TSLib's module> itself, one module object under two
names, so classes compare equal and isinstance holds whichever name a file imports them by.
"""
import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

_TSLIB = Path(__file__).resolve().parent / "tslib"
TSLIB_MODULES = tuple(sorted(path.stem for path in _TSLIB.glob("*.py") if path.stem != "__init__"))


class _TSLibNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """layers.<name> -> layers.tslib.<name>, for TSLib's module names only, and only under this package (a TSLib
    checkout's own `layers` package on sys.path imports its files as usual)."""

    def find_spec(self, fullname, path, target=None):
        parent, _, name = fullname.rpartition(".")
        ours = path is not None and any(Path(entry).resolve() == _TSLIB.parent for entry in path)
        if parent == "layers" and name in TSLIB_MODULES and ours:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(f"layers.tslib.{spec.name.rpartition('.')[2]}")
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # the import machinery gave it the alias's spec: undo


# Last on the path: a real file always wins, and a second import of this package adds no second finder.
if not any(type(finder).__name__ == "_TSLibNames" for finder in sys.meta_path):
    sys.meta_path.append(_TSLibNames())
