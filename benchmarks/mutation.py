"""Mutation testing of the core with cosmic-ray: would the suite notice a small realistic bug?

cosmic-ray mutates one spot of exp/, utils/distributed.py, utils/ddp.py, utils/worker.py, utils/metrics.py,
utils/checkpoint.py or data_provider/ at a time (benchmarks/mutation.toml) and runs
`python -m benchmarks.mutation test`, which runs the tests that pin the mutated module (TARGETS; the whole
suite per mutant is too slow on 2 cores). A mutant the tests fail on is killed; one they pass survives, and
each survivor is triaged: a new test, or a line in EQUIVALENT saying why no test can tell it apart.

    pip install -e ".[mutation]"                                          # cosmic-ray
    python -m benchmarks.mutation init /tmp/mutation.sqlite --sample 60   # every mutant, or a seeded sample
    cosmic-ray exec benchmarks/mutation.toml /tmp/mutation.sqlite         # mutates files in place: use a clean clone
    python -m benchmarks.mutation report /tmp/mutation.sqlite --out benchmarks/results/mutation.md
    python -m benchmarks.mutation recheck /tmp/mutation.sqlite   # survivors again, after new tests
    python -m benchmarks.mutation report /tmp/mutation.sqlite --recheck --out benchmarks/results/mutation.md
    python -m benchmarks.mutation replay            # every recorded survivor (results/mutation_seed*.md) again
    python -m benchmarks.mutation replay --only utils/checkpoint.py --tests tests/test_run_identity.py

Not part of CI's run; the samples so far and their triage: docs/testing.md.
"""
import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "benchmarks" / "mutation.toml"

# module (or package prefix) -> the test files that pin it, fastest first (pytest -x stops at the first failure)
TARGETS = {
    "exp/forward.py": ["test_slicing.py", "test_model_objective.py", "test_exactness_cli.py", "test_probabilistic.py"],
    "exp/outputs.py": ["test_outputs.py", "test_results_files.py", "test_test_windows.py"],
    "exp/settings.py": ["test_training.py", "test_argument_checks.py", "test_run_identity.py", "test_zero_shot.py",
                        "test_multi_gpu_flags.py", "test_bad_input.py", "test_amp_and_compile.py"],
    "exp/adaptation.py": ["test_pretrain.py"],
    "exp/ensemble.py": ["test_ensemble.py", "test_bad_input.py"],
    "exp/export.py": ["test_openltm_checkpoints.py", "test_foundation.py"],
    "exp/lora.py": ["test_lora.py"],
    "exp/scoring.py": ["test_probabilistic.py", "test_probabilistic_outputs.py"],
    "exp/exp_basic.py": ["test_training.py", "test_amp_and_compile.py", "test_zero.py", "test_unused_parameters.py"],
    "exp/exp_forecast.py": ["test_training.py", "test_slicing.py", "test_progress.py", "test_scaling.py",
                            "test_failing_ranks.py", "test_exactness_cli.py", "test_resume_and_restart.py",
                            "test_steps.py", "test_world_size_invariance.py", "test_zero.py"],
    "exp/short_term.py": ["test_m4.py", "test_competitions.py"],
    "exp/steps.py": ["test_steps.py", "test_training.py", "test_progress.py", "test_scaling.py",
                     "test_world_size_invariance.py", "test_resume_and_restart.py", "test_zero.py"],
    "utils/distributed.py": ["test_distributed.py", "test_failing_ranks.py", "test_training.py",
                             "test_process_lifecycle.py", "test_scaling.py", "test_zero.py", "test_slurm.py",
                             "test_threads.py", "test_unused_parameters.py"],
    "utils/ddp.py": ["test_distributed.py", "test_failing_ranks.py", "test_training.py", "test_process_lifecycle.py",
                     "test_scaling.py", "test_zero.py", "test_unused_parameters.py"],
    "utils/worker.py": ["test_failing_ranks.py", "test_process_lifecycle.py", "test_slurm.py"],
    "utils/metrics.py": ["test_probabilistic_metrics.py", "test_distributed.py", "test_exactness_cli.py",
                         "test_results_files.py", "test_failing_ranks.py", "test_m4.py", "test_gift_eval.py"],
    "utils/probabilistic.py": ["test_probabilistic.py", "test_world_size_invariance.py"],
    "utils/checkpoint.py": ["test_cli.py", "test_run_identity.py", "test_openltm_checkpoints.py", "test_steps.py",
                            "test_resume_and_restart.py", "test_bad_input.py"],
    "data_provider/permutation.py": ["test_permutation.py", "test_data.py", "test_corpus.py"],
    "data_provider/corpus.py": ["test_corpus.py", "test_bad_input.py"],
    "data_provider/global_batches.py": ["test_world_size_invariance.py", "test_window_loader.py", "test_steps.py",
                                        "test_resume_and_restart.py", "test_scaling.py", "test_unused_parameters.py"],
    "data_provider/m4.py": ["test_m4.py", "test_bad_input.py"],
    "data_provider/competitions.py": ["test_competitions.py", "test_m4.py"],
    "data_provider/": ["test_permutation.py", "test_data.py", "test_window_loader.py", "test_pretrain.py",
                       "test_slicing.py", "test_argument_checks.py", "test_corpus.py", "test_steps.py",
                       "test_openltm_scripts.py", "test_bad_input.py", "test_m4.py"],
}

# "module:line:operator" -> why no test can tell this mutant from the original (filled in by triage)
EQUIVALENT = {
    "data_provider/files.py:187:core/NumberReplacer":
        "`splitlines()[0]` -> `[-1]` on pandas' message where no single date is to blame: the one case found "
        "(mixed time zones) has a one-line message; the survivor led to that case, which raised a raw "
        "traceback (fixed, tests/test_data.py::test_dates_whose_offset_changes_with_daylight_saving_are_refused_saying_how_to_write_them)",
    "exp/steps.py:101:core/ReplaceBinaryOperator_Sub_Mod":
        "`perf_counter() - started` -> `%` in the samples/s of a log line: perf_counter counts from boot, so "
        "the two differ only for a stretch longer than the machine had been up when it began",
    "data_provider/interface.py:63:core/ReplaceTrueWithFalse":
        "the default of `with_marks` in the interface's abstract window_dataset, which only raises "
        "NotImplementedError: every data kind defines its own method with its own default",
    "exp/outputs.py:294:core/NumberReplacer":
        "`[0]` -> `[-1]` on the forecast of predict's batch: the batch is the one window of future_input "
        "(see exp/outputs.py:293 below), so its first and last rows are the same",
    "utils/metrics.py:365:core/ReplaceComparisonOperator_GtE_NotEq":
        "`pred.dim() >= 2` -> `!= 2` in batch_loss's layout choice: as for the USub mutant of that line, the "
        "layout only decides which contiguous copy the mean runs over; the same elements are averaged",
    "data_provider/permutation.py:89:core/NumberReplacer":
        "ShuffledShards.__iter__ computes its positions in chunks of 1 << 16; another chunk size yields the "
        "same positions in the same order (the chunking only bounds the memory of one call)",
    "exp/exp_basic.py:55:core/ReplaceComparisonOperator_Eq_Is":
        "`self._amp_dtype == torch.float16` -> `is`: torch dtypes are singletons, so the two agree",
    "utils/checkpoint.py:428:core/ReplaceBinaryOperator_Sub_BitXor":
        "`- {None}` -> `^ {None}` may add None to this launch's ids, but last.pth's `launches` never holds None "
        "(save_training_state drops it), so the intersection, the only use, is the same",
    "data_provider/data_factory.py:51:core/ReplaceFalseWithTrue":
        "the data fingerprint reads only len() of each split's windows; with_marks decides whether batches "
        "carry time features, not how many windows there are",
    "utils/metrics.py:365:core/ReplaceUnaryOperator_USub_UAdd":
        "`pred.transpose(-1, -2)` -> `transpose(-1, +2)` in the layout test of batch_loss: the test only picks "
        "the contiguous layout for speed (a 3-D pred then keeps its strided one; for 4-D the two are the same "
        "swap); the loss is the mean over the same elements in either layout (to float32 rounding of the summation order)",
    "utils/distributed.py:388:core/NumberReplacer":
        "`os.cpu_count() or 1` -> `or 0`: cpu_count() is None only where the count is unknown, and then "
        "max(1, 1 // n) and max(1, 0 // n) both give one thread",
    "exp/steps.py:180:core/ReplaceComparisonOperator_Lt_NotEq":
        "`subset_rand_ratio < 1` -> `!= 1` in the opening line: the ratio is in (0, 1] (a larger one is refused "
        "before training), where the two agree",
    "data_provider/data_factory.py:125:core/ReplaceComparisonOperator_Eq_Is":
        "`flag == \"train\"` -> `flag is \"train\"`: every caller passes the split as a literal from the code "
        "(data_factory.SPLITS, 'train'), and CPython interns such literals, so `is` holds exactly when `==` does",
    "exp/outputs.py:293:core/NumberReplacer":
        "`dataset.__getitems__([0])` -> `([-1])` in predict: future_input's dataset is x_len + horizon rows, "
        "exactly one window's span (horizon = pred_len / test_pred_len >= 1), so it holds one window and -1 is 0",
    "utils/distributed.py:295:core/ReplaceComparisonOperator_Eq_GtE":
        "`get_backend() == \"nccl\"` -> `>= \"nccl\"` in _device_for_collectives: setup only ever starts gloo or "
        "nccl groups, and \"gloo\" >= \"nccl\" is False like ==",
    "data_provider/data_factory.py:137:core/NumberReplacer":
        "`batch_size > 0` -> `> -1` for evaluation batches: --eval_batch_size is parsed as a positive int and "
        "an unset one is 4 x --batch_size, itself checked > 0 two lines above, so the batch size here is >= 1",
    "utils/ddp.py:111:core/ReplaceComparisonOperator_IsNot_Is":
        "has_running_statistics -> False for BatchNorm models: DDP then stops re-broadcasting rank 0's buffers "
        "before each forward. BatchNorm normalises training batches with their own statistics and only updates "
        "the running ones, so rank 0's running statistics evolve the same either way; every evaluation starts "
        "with broadcast_buffers (rank 0's on every rank) and only rank 0 saves, so only other ranks' statistics "
        "between evaluations differ, which nothing reads",
    "data_provider/corpus.py:337:core/ReplaceComparisonOperator_Eq_Is":
        "`index.get(\"version\") == VERSION` -> `is`: VERSION is a small int and json.load gives ints for integer "
        "literals; CPython keeps one object per int in [-5, 256], so `is` holds exactly when `==` does for every "
        "version a build writes",
    "data_provider/files.py:208:core/NumberReplacer":
        "the read-file cache's size, 8 -> 7 files kept per process: a run reads one data file, and any size "
        "gives the same tables (the cache only saves re-reading it for the next split or run)",
    "data_provider/table.py:93:core/ReplaceComparisonOperator_Eq_GtE":
        "`features == \"S\"` -> `>= \"S\"` in select_columns: the line above admits only M, S and MS, and of "
        "those only \"S\" is >= \"S\" (\"M\" and \"MS\" sort before it)",
}


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


def report(session, rechecked=None):
    """The kill rate and every survivor, as markdown; with `rechecked` (recheck's answers) also the
    rate after the tests written for the survivors."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    with use_db(session) as db:
        done = [(item, result) for item, result in db.completed_work_items
                if result.worker_outcome != WorkerOutcome.SKIPPED]
        total = db.num_work_items
    killed = sum(result.test_outcome != TestOutcome.SURVIVED for _, result in done)
    # a kill by time-out may be a slow machine rather than the tests: re-run those on idle cores
    timed_out = sum(result.test_outcome == TestOutcome.KILLED and (result.output or "").strip() == "timeout"
                    for _, result in done)
    found = survivors(session)
    equivalent = [key for key, _ in found if key in EQUIVALENT]
    later = [key for key, _ in found if (rechecked or {}).get(key) == "killed"]
    gone = [key for key, _ in found if (rechecked or {}).get(key, "").startswith("code changed")]
    judged = len(done) - len(equivalent)
    lines = ["# Mutation testing of the core", "",
             f"Modules: {', '.join(_module_paths())}. Commands: `benchmarks/mutation.py`'s docstring.", "",
             f"- mutants: {total} in all; run: {len(done)} (a seeded random sample)",
             f"- killed: {killed} ({timed_out} by cosmic-ray's time-out); survived: {len(found)}, of which "
             f"equivalent: {len(equivalent)}",
             f"- kill rate of non-equivalent mutants: {killed / judged:.1%}" if judged else "- nothing run"]
    if rechecked is not None and judged:
        lines.append(f"- after the tests written for the survivors (`recheck`): {len(later)} more killed, {len(gone)} "
                     f"gone with the code they mutated (removed as dead code or rewritten): "
                     f"{(killed + len(later)) / (judged - len(gone)):.1%}")
    lines += ["", "## Survivors", ""]
    for key, diff in found:
        status = (f"Equivalent: {EQUIVALENT[key]}" if key in EQUIVALENT
                  else f"Recheck: {rechecked[key]}" if rechecked and key in rechecked else "Not yet triaged.")
        lines += [f"### `{key}`", "", status, "", "```diff", (diff or "").replace("--- mutation diff ---", "").strip(),
                  "```", ""]
    return "\n".join(lines) + "\n"


def survivors(session):
    """(key, diff) of every mutant that survived in `session`."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import TestOutcome

    with use_db(session) as db:
        found = []
        for item, result in db.completed_work_items:
            if result.test_outcome == TestOutcome.SURVIVED:
                mutation = item.mutations[0]
                found.append((f"{mutation.module_path}:{mutation.start_pos[0]}:{mutation.operator_name}", result.diff))
    return sorted(found)


def apply_diff(diff):
    """git apply a mutant's diff to the checkout; False if it no longer applies. cosmic-ray's diff of a
    file's last line ends with a blank context line the file does not have: retried without it."""
    lines = [line for line in diff.splitlines() if not line.startswith("--- mutation diff")]
    attempts = [lines]
    if lines and not lines[-1].strip():
        attempts.append(lines[:-1])
    for attempt in attempts:
        applied = subprocess.run(["git", "apply", "--recount", "-"], cwd=REPO, input="\n".join(attempt) + "\n",
                                 text=True, capture_output=True)
        if applied.returncode == 0:
            return True
    return False


def recheck(session, only=()):
    """Apply each survivor's diff (or those in `only`) to this clean checkout, run its targeted tests,
    undo it: which survivors today's tests kill (a diff that no longer applies: the code there is
    gone). The answers are kept beside the session, in SESSION.recheck.json, for `report --recheck`."""
    if mutated_files():
        raise SystemExit("recheck needs a checkout without uncommitted changes to .py files")
    store = Path(session + ".recheck.json")
    results = json.loads(store.read_text()) if store.exists() else {}
    for key, diff in survivors(session):
        if only and key not in only:
            continue
        if not apply_diff(diff):
            results[key] = "code changed (diff no longer applies)"
        else:
            try:
                results[key] = "killed" if run_targeted_tests() else "survived"
            finally:
                subprocess.run(["git", "checkout", "--", *mutated_files()], cwd=REPO, check=True)
        print(f"{results[key]:>9}  {key}", flush=True)
        store.write_text(json.dumps(results, indent=1, sort_keys=True))
    return results


RECORDS = REPO / "benchmarks" / "results"


def recorded_mutants(pattern="mutation_seed*.md"):
    """[(record file, key, status line, diff)] of every survivor the committed reports hold, in file order."""
    import re

    found = []
    for path in sorted(RECORDS.glob(pattern)):
        for match in re.finditer(r"^### `([^`]+)`\n\n(.*?)\n\n```diff\n(.*?)```", path.read_text(), re.S | re.M):
            key, status, diff = match.groups()
            found.append((path.name, key, status.splitlines()[0], diff))
    return found


def apply_by_line(diff):
    """Plant a one-line mutant whose diff no longer applies (the code around it moved or changed): its removed
    line, found exactly once (spaces aside) in today's file or, where that file lost it, once among the
    modules beside it (a module split in two), becomes its added line. False where it is not."""
    path = next((line[6:] for line in diff.splitlines() if line.startswith("+++ b/")), None)
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if path is None or len(removed) != 1 or len(added) != 1 or not (REPO / path).parent.is_dir():
        return False
    own = REPO / path
    for candidates in ([own] if own.is_file() else [], sorted(own.parent.glob("*.py"))):
        found = [(file, i) for file in candidates for i, line in enumerate(file.read_text().split("\n"))
                 if line.strip() == removed[0].strip()]
        if len(found) == 1:
            file, i = found[0]
            lines = file.read_text().split("\n")
            lines[i] = lines[i][:len(lines[i]) - len(lines[i].lstrip())] + added[0].strip()
            file.write_text("\n".join(lines))
            return True
        if found:
            return False
    return False


def replay(only=(), tests=(), pattern="mutation_seed*.md"):
    """Apply each recorded survivor's diff whose key starts with one of `only` (all if none; the equivalent ones
    left out) to this clean checkout, run its targeted tests (or `tests`), undo it. A mutant is killed when the
    tests fail. A diff that no longer applies is planted by its line where that line is still there once
    (apply_by_line: outcomes "killed, moved" / "survived, moved"), else counted as code that changed since.
    Returns {outcome: count}."""
    if mutated_files():
        raise SystemExit("replay needs a checkout without uncommitted changes to .py files: use a clean clone")
    counts = {}
    for record, key, status, diff in recorded_mutants(pattern):
        if status.startswith("Equivalent") or (only and not key.startswith(tuple(only))):
            continue
        moved = not apply_diff(diff) and apply_by_line(diff)
        if not mutated_files():
            outcome = "code changed"
        else:
            try:
                files = mutated_files()
                chosen = list(tests) or targets_for(files[0])
                command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *chosen]
                code = subprocess.run(command, cwd=REPO, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
                                      capture_output=True).returncode
                outcome = ("killed" if code not in (0, 5) else "survived") + (", moved" if moved else "")  # 5: none
            finally:
                subprocess.run(["git", "checkout", "--", *mutated_files()], cwd=REPO, check=True)
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{outcome:>12}  {key}  ({record})", flush=True)
    print(", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no recorded mutant chosen")
    return counts


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
    p_report.add_argument("--recheck", action="store_true", help="include recheck's answers (SESSION.recheck.json)")
    p_recheck = sub.add_parser("recheck", help="run each survivor again against today's tests")
    p_recheck.add_argument("session")
    p_recheck.add_argument("--only", nargs="*", default=(), help="just these survivors (module:line:operator)")
    p_replay = sub.add_parser("replay", help="every recorded survivor (benchmarks/results/mutation_seed*.md) "
                                             "against today's tests: apply, test, undo")
    p_replay.add_argument("--only", nargs="*", default=(), help="keys starting so (module, module:line, ...)")
    p_replay.add_argument("--tests", nargs="*", default=(), help="these pytest paths instead of the module's targets")
    p_replay.add_argument("--records", default="mutation_seed*.md", help="report files under benchmarks/results/")
    args = parser.parse_args(argv)
    if args.command == "replay":
        counts = replay(args.only, args.tests, args.records)
        return 1 if counts.get("survived") or counts.get("survived, moved") else 0
    if args.command == "recheck":
        recheck(args.session, args.only)
        return 0
    if args.command == "test":
        return run_targeted_tests()
    if args.command == "init":
        init(args.session, args.sample, args.seed)
        return 0
    rechecked = None
    if args.recheck:
        store = Path(args.session + ".recheck.json")
        if not store.exists():
            parser.error(f"no {store}: run `python -m benchmarks.mutation recheck {args.session}` first")
        rechecked = json.loads(store.read_text())
    text = report(args.session, rechecked)
    if args.out:
        if os.path.exists(args.out) and not args.overwrite:
            parser.error(f"{args.out} exists; pass --overwrite to replace it")
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
