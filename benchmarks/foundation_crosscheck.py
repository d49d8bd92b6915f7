"""The released foundation models against their official packages: agreement of the quantile forecasts at the
released configurations' shapes (random weights in the released layout) and zero-shot speed side by side.

    python benchmarks/foundation_crosscheck.py                       # every release whose package is installed
    python benchmarks/foundation_crosscheck.py --models NAME[,NAME] --skip_speed   # --model names

Each release's checks live in its folder, models/foundation/<release>/crosscheck.py, as `crosscheck()` and
`speed()`, each returning markdown lines (the side environment each needs is in its docstring); this driver runs
them where the package is installed and writes benchmarks/results/foundation_<Name>.md (the figures each
release's README.md quotes).
"""
import argparse
import importlib
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def crosscheck_modules():
    """{--model name: its crosscheck module}: every release folder with a crosscheck.py (models/foundation/)."""
    sys.path.insert(0, str(REPO))
    from models import model_files

    return {name: ".".join(path.parent.relative_to(REPO).parts) + ".crosscheck"
            for name, path in model_files().items() if (path.parent / "crosscheck.py").is_file()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modules = crosscheck_modules()
    parser.add_argument("--models", default=",".join(modules))
    parser.add_argument("--skip_speed", action="store_true")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    for name in args.models.split(","):
        if name not in modules:
            parser.error(f"unknown model {name}; choose from {', '.join(modules)}")
        checks = importlib.import_module(modules[name])
        started = time.time()
        lines = [f"# {name} against its official package", "",
                 f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
                 f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}", "", "## Agreement", "",
                 *checks.crosscheck()]
        if not args.skip_speed:
            lines += ["", "## Zero-shot speed (one CPU process, batch 64)", "", *checks.speed()]
        text = "\n".join(lines) + "\n"
        print(text)
        path = Path(args.out) / f"foundation_{name}.md"
        path.write_text(text)
        print(f"{name}: {time.time() - started:.0f} s, written to {path}")


if __name__ == "__main__":
    main()
