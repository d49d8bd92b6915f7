"""Mutation testing of the core with cosmic-ray: would the suite notice a small realistic bug?

cosmic-ray mutates one spot of exp/, utils/distributed.py, utils/metrics.py, utils/checkpoint.py or
data_provider/ at a time (benchmarks/mutation.toml) and runs `python -m benchmarks.mutation test`,
which runs the tests that pin the mutated module (TARGETS; the whole suite per mutant is too slow on
2 cores). A mutant the tests fail on is killed; one they pass survives, and each survivor is triaged:
a new test, or a line in EQUIVALENT saying why no test can tell it apart.

    pip install cosmic-ray
    python -m benchmarks.mutation init /tmp/mutation.sqlite --sample 60   # every mutant, or a seeded sample
    cosmic-ray exec benchmarks/mutation.toml /tmp/mutation.sqlite         # mutates files in place: use a clean clone
    python -m benchmarks.mutation report /tmp/mutation.sqlite --out benchmarks/results/mutation.md

Not part of CI's run (see README, Tests).
"""
import argparse
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "benchmarks" / "mutation.toml"

# module (or package prefix) -> the test files that pin it, fastest first (pytest -x stops at the first failure)
TARGETS = {
    "exp/forward.py": ["test_slicing.py", "test_exactness_cli.py"],
    "exp/outputs.py": ["test_outputs.py", "test_results_files.py"],
    "exp/settings.py": ["test_argument_checks.py", "test_run_identity.py", "test_bad_input.py"],
    "exp/adaptation.py": ["test_pretrain.py"],
    "exp/exp_basic.py": ["test_training.py", "test_amp_and_compile.py", "test_zero.py"],
    "exp/exp_forecast.py": ["test_training.py", "test_slicing.py", "test_progress.py", "test_failing_ranks.py",
                            "test_exactness_cli.py", "test_resume_and_restart.py"],
    "utils/distributed.py": ["test_distributed.py", "test_failing_ranks.py", "test_training.py",
                             "test_process_lifecycle.py"],
    "utils/metrics.py": ["test_distributed.py", "test_exactness_cli.py", "test_results_files.py"],
    "utils/checkpoint.py": ["test_cli.py", "test_run_identity.py", "test_resume_and_restart.py", "test_bad_input.py"],
    "data_provider/": ["test_data.py", "test_window_loader.py", "test_pretrain.py", "test_slicing.py",
                       "test_argument_checks.py"],
}

# "module:line:operator" -> why no test can tell this mutant from the original (filled in by triage)
EQUIVALENT = {}


def targets_for(path):
    for prefix, tests in TARGETS.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return [f"tests/{name}" for name in tests]
    raise SystemExit(f"no targeted tests for {path}: add it to benchmarks/mutation.py TARGETS")


def mutated_files():
    out = subprocess.run(["git", "diff", "--name-only"], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line.endswith(".py")]


def run_targeted_tests():
    """cosmic-ray's test command: the targeted tests of the one mutated file; exit code 0 = survived."""
    files = mutated_files()
    if len(files) != 1:
        print(f"expected one mutated file, found {files}", file=sys.stderr)
        return 2
    tests = targets_for(files[0])
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(command, cwd=REPO, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1")).returncode


def init(session, sample, seed):
    """A session of every mutant of the configured modules, or `sample` of them chosen from `seed`."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    subprocess.run(["cosmic-ray", "init", str(CONFIG), session], cwd=REPO, check=True)
    subprocess.run(["cr-filter-operators", session, str(CONFIG)], cwd=REPO, check=True)
    subprocess.run(["cr-filter-pragma", session], cwd=REPO, check=True)
    with use_db(session) as db:
        pending = sorted(item.job_id for item in db.pending_work_items)
        print(f"{len(pending)} mutants in {', '.join(_module_paths())}")
        if sample and sample < len(pending):
            chosen = set(random.Random(seed).sample(pending, sample))
            db.set_multiple_results([j for j in pending if j not in chosen],
                                    WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
            print(f"kept a sample of {sample} (seed {seed}); the rest are marked skipped")


def _module_paths():
    import tomllib

    return tomllib.loads(CONFIG.read_text())["cosmic-ray"]["module-path"]


def report(session):
    """The kill rate and every survivor, as markdown."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    with use_db(session) as db:
        done = [(item, result) for item, result in db.completed_work_items
                if result.worker_outcome != WorkerOutcome.SKIPPED]
        pending = db.num_work_items - db.num_results
    outcomes = Counter()
    survivors = []
    for item, result in done:
        mutation = item.mutations[0]
        key = f"{mutation.module_path}:{mutation.start_pos[0]}:{mutation.operator_name}"
        if result.test_outcome == TestOutcome.SURVIVED:
            outcomes["equivalent" if key in EQUIVALENT else "survived"] += 1
            survivors.append((key, EQUIVALENT.get(key), result.diff or ""))
        else:
            outcomes["killed"] += 1
    judged = outcomes["killed"] + outcomes["survived"]
    rate = outcomes["killed"] / judged if judged else float("nan")
    lines = ["# Mutation testing of the core", "",
             f"Modules: {', '.join(_module_paths())}. Run with `python -m benchmarks.mutation` (its docstring).", "",
             f"- mutants run: {len(done)} ({pending} pending)",
             f"- killed: {outcomes['killed']}, survived: {outcomes['survived']}, equivalent: {outcomes['equivalent']}",
             f"- kill rate of non-equivalent mutants: {rate:.1%}", "", "## Survivors", ""]
    for key, reason, diff in sorted(survivors):
        lines += [f"### `{key}`", "", f"Equivalent: {reason}" if reason else "Not yet triaged.", "",
                  "```diff", diff.strip(), "```", ""]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_init = sub.add_parser("init", help="create a session of mutants")
    p_init.add_argument("session")
    p_init.add_argument("--sample", type=int, default=0, help="run only this many mutants (0: all)")
    p_init.add_argument("--seed", type=int, default=0)
    sub.add_parser("test", help="cosmic-ray's test command (targeted tests of the mutated module)")
    p_report = sub.add_parser("report", help="kill rate and survivors")
    p_report.add_argument("session")
    p_report.add_argument("--out", help="write the markdown here")
    p_report.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = parser.parse_args(argv)
    if args.command == "test":
        return run_targeted_tests()
    if args.command == "init":
        init(args.session, args.sample, args.seed)
        return 0
    text = report(args.session)
    if args.out:
        if os.path.exists(args.out) and not args.overwrite:
            parser.error(f"{args.out} exists; pass --overwrite to replace it")
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
