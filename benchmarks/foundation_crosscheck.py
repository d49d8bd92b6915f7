"""The released foundation models against their official packages: agreement of the quantile forecasts at the
released configurations' shapes (random weights in the released layout) and zero-shot speed side by side.

    python benchmarks/foundation_crosscheck.py --models ChronosBolt,Chronos2,TimesFM25,TiRex
    python benchmarks/foundation_crosscheck.py --models TiRex --skip_speed

Each model's checks live in benchmarks/foundation/<module>.py as `crosscheck()` and `speed()`, each returning
markdown lines; this driver runs them where the package is installed and writes
benchmarks/results/foundation_<Name>.md (the figures docs/foundation.md quotes).
"""
import argparse
import importlib
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = {"ChronosBolt": "chronos_bolt", "Chronos2": "chronos2", "TimesFM25": "timesfm25", "TiRex": "tirex"}
MODULES["TimerBase"] = "timer_base"  # issue 40: run in /work/venvs/timer (transformers 4.40.1; recreate: benchmarks/foundation/timer_base.py)
MODULES["Moirai2"] = "moirai2"  # issue 40: run in /work/venvs/uni2ts (official uni2ts 2.0.0 without its pins; recreate: benchmarks/foundation/moirai2.py)
MODULES["TimeMoE"] = "time_moe"  # issue 40: run in /work/venvs/timemoe (transformers 4.40.1 + Time-MoE's own code; recreate: benchmarks/foundation/time_moe.py)
MODULES["Sundial"] = "sundial"  # issue 40: run in /work/venvs/sundial (transformers 4.40.1; recreate: benchmarks/foundation/sundial.py)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODULES))
    parser.add_argument("--skip_speed", action="store_true")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    for name in args.models.split(","):
        if name not in MODULES:
            parser.error(f"unknown model {name}; choose from {', '.join(MODULES)}")
        checks = importlib.import_module(f"benchmarks.foundation.{MODULES[name]}")
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
