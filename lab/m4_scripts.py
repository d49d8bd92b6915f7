"""TSLib's M4 scripts (scripts/short_term_forecast/<Model>_M4.sh) run unchanged here: every command line of
the script of each model this codebase has, a training step and the test each, on a synthetic M4-layout
folder (data_provider.m4.write_synthetic_m4). The script is read from a TSLib checkout, never copied: bash
expands it with its `python` replaced by a recorder, and each command line goes to run.py as written,
followed only by the data folder, one step, and outputs in a temporary folder.

    python -m lab.m4_scripts --tslib /work/tslib [--models TimesNet DLinear]

Prints one line per script: its runs, whether each ended well, and the summary's Average OWA once the six
frequencies are forecast (meaningless after one step; it shows the summary was computed).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORDER = 'python() { shift 2; printf "%s\\x1f" "$@"; printf "\\n"; }; source "$1"'
STEP = ["--train_steps", "1", "--num_threads", "1", "--quiet", "--no_plots"]


def command_lines(script):
    out = subprocess.run(["bash", "-c", RECORDER, "_", str(script)], capture_output=True, text=True, check=True).stdout
    return [line.rstrip("\x1f").split("\x1f") for line in out.splitlines()]


def run_script(script, data, folder):
    """(runs, failures, the last record) of one script's command lines."""
    failures, last = [], None
    folder.mkdir(parents=True, exist_ok=True)
    lines = command_lines(script)
    for line in lines:
        argv = [*line, "--root_path", str(data), *STEP, "--checkpoints", str(folder / "checkpoints"),
                "--results_dir", str(folder / "results")]
        proc = subprocess.run([sys.executable, str(REPO / "run.py"), *argv], cwd=folder, capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode:
            failures.append(f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:200]}")
    results = folder / "results" / "results.jsonl"
    if results.exists():
        last = json.loads(results.read_text().splitlines()[-1])
    return len(lines), failures, last


def main(argv=None):
    from data_provider.m4 import write_synthetic_m4
    from models import available_models

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tslib", default="/work/tslib", help="a TSLib checkout")
    parser.add_argument("--models", nargs="*", help="default: every model of the checkout's M4 scripts found here")
    options = parser.parse_args(argv)
    scripts = sorted((Path(options.tslib) / "scripts" / "short_term_forecast").glob("*_M4.sh"))
    here = set(available_models())
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        data = write_synthetic_m4(Path(tmp) / "m4", per_pattern=3, seed=0)
        for script in scripts:
            model = next((line.split("=", 1)[1].strip() for line in script.read_text().splitlines()
                          if line.startswith("model_name=")), None)
            if options.models and model not in options.models:
                continue
            if model not in here:
                print(f"{script.name}: model {model} is not in models/ here (not run)")
                continue
            started = time.time()
            runs, failures, last = run_script(script, data, Path(tmp) / model)
            owa = (last or {}).get("m4_summary", {}).get("OWA", {}).get("Average")
            failed += bool(failures)
            print(f"{script.name}: {runs - len(failures)} of {runs} runs ended well"
                  + (f", summary Average OWA {owa:.3f}" if owa is not None else ", no summary")
                  + f" ({time.time() - started:.0f} s)" + "".join(f"\n    {f}" for f in failures), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
