"""`--model Ensemble` in both harnesses, once, on fixtures: three release fixture folders (reduced shapes, random
weights: tests/test_foundation.py's RELEASES rows that forecast GIFT-Eval's nine levels, picked by that property)
and a DLinear trained here for one epoch on an ETTh1-shaped file (tests/helpers.py), scored by
benchmarks/gift_eval.py on the suite's small synthetic GIFT-Eval sets (tests/test_gift_eval.py) and by
benchmarks/fev_bench.py on the suite's tiny fev benchmark (benchmarks/fev_bench_reference.py). It vouches that
an ensemble row comes out of each harness end to end; the figures are of random weights and synthetic data, not of
any release.

    python -m lab.ensemble_harness_fixtures --out lab/results/ensemble_harness_fixtures.md
    python -m benchmarks.results_page add lab/results/ensemble_harness_fixtures.md
"""
import argparse
import csv
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEVELS_9 = tuple(round(0.1 * k, 1) for k in range(1, 10))


def fixtures():
    """The suite's fixture writers (they live beside the suite)."""
    sys.path.insert(0, str(REPO / "tests"))
    import test_foundation
    import test_gift_eval
    from helpers import write_etth1_shaped

    return test_foundation.RELEASES, test_gift_eval.write_synthetic_sets, write_etth1_shaped


def chosen_rows(releases, count=3):
    import importlib.util

    # finished releases (their cross-check result committed), forecasting the nine levels, taking context 64
    rows = [row for row in releases.values() if tuple(row.levels) == LEVELS_9 and "--num_samples" not in row.run
            and (REPO / "benchmarks" / "results" / f"foundation_{row.name}.md").is_file()
            and int(row.run[1]) >= 64 and (not row.package or importlib.util.find_spec(row.package.split(".")[0]))]
    return sorted(rows, key=lambda row: bool(row.package))[:count]


def python(*argv):
    proc = subprocess.run([sys.executable, *map(str, argv)], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(map(str, argv))}\n{proc.stderr[-3000:]}")
    return proc


def main(argv=None):
    from benchmarks.fev_bench_reference import write_benchmark

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "lab" / "results" / "ensemble_harness_fixtures.md"))
    args = p.parse_args(argv)
    releases, write_synthetic_sets, write_etth1_shaped = fixtures()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = chosen_rows(releases)
        folders = [row.write(tmp / "releases" / row.name / row.dirname) for row in rows]
        etth1 = write_etth1_shaped(tmp / "etth1")
        python("run.py", "--data", "ETTh1", "--root_path", etth1, "--data_path", "ETTh1.csv", "--model", "DLinear",
               "--seq_len", 64, "--pred_len", 24, "--label_len", 0, "--loss", "quantile", "--train_epochs", 1,
               "--checkpoints", tmp / "checkpoints", "--results_dir", tmp / "results", "--no_plots", "--quiet")
        checkpoint = next((tmp / "checkpoints").glob("*/checkpoint.pth"))
        members = ",".join(map(str, [*folders, checkpoint]))
        model = ["--model", "Ensemble", "--members", members, "--seq_len", 64, "--num_threads", 1]
        write_synthetic_sets(tmp / "gift")
        python("-m", "benchmarks.gift_eval", *model, "--data_root", tmp / "gift", "--datasets", "hospital",
               "m4_weekly", "electricity/H", "--terms", "short", "--out", tmp / "gift_out")
        tasks = write_benchmark(tmp / "fev")
        python("-m", "benchmarks.fev_bench", *model, "--tasks", tasks, "--data_root", Path(tasks).parent,
               "--out", tmp / "fev_out")
        gift = list(csv.DictReader((tmp / "gift_out" / "all_results.csv").open()))
        fev = list(csv.DictReader((tmp / "fev_out" / "summaries.csv").open()))
    shown = ", ".join(f"{row.name} ({row.dirname} fixture)" for row in rows)
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "lab.ensemble_harness_fixtures",
                                                *(argv if argv is not None else sys.argv[1:])])
    gift_rows = [f"| {r['dataset']} | {float(r['eval_metrics/MASE[0.5]']):.6f} | "
                 f"{float(r['eval_metrics/mean_weighted_sum_quantile_loss']):.6f} | {float(r['eval_metrics/MSIS']):.6f} |"
                 for r in gift]
    fev_rows = [f"| {r['model_name']} | {r.get('task_name') or r['dataset_config']} | {float(r['SQL']):.6f} | {float(r['MASE']):.6f} | "
                f"{float(r['WQL']):.6f} |" for r in fev]
    text = "\n".join([
        "# Ensemble rows in the GIFT-Eval and fev-bench harnesses, on fixtures (random weights, synthetic data)", "",
        f"Made by `{command}`: `--model Ensemble --members` of {shown} and a DLinear trained one epoch on an "
        "ETTh1-shaped file (`--loss quantile`, context 64, horizon 24, rolled out by the harness), the median of their "
        "quantiles at GIFT-Eval's nine levels, `--seq_len 64`. FIXTURES: the releases hold random weights and the data "
        "is the suite's synthetic GIFT-Eval sets and tiny fev benchmark; these figures say the ensemble row comes out "
        "of each harness end to end, not how well any ensemble forecasts.", "",
        "GIFT-Eval (`python -m benchmarks.gift_eval`, all_results.csv):", "",
        "| dataset | MASE | CRPS | MSIS |", "|---|---|---|---|", *gift_rows, "",
        "fev-bench (`python -m benchmarks.fev_bench`, summaries.csv; seasonal_naive is the harness's baseline row):", "",
        "| model | task | SQL | MASE | WQL |", "|---|---|---|---|---|", *fev_rows, ""])
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
