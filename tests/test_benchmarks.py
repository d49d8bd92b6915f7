"""The harnesses in benchmarks/ (GIFT-Eval's and M4's have files of their own): the results table beside the
published figures (benchmarks/report.py), reproduce.py's command line, bench_train.py's output file, mutation
testing's targets, and bench_models.py's step timings, TSLib's model beside ours included. The lab's scripts:
tests/test_lab.py."""
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from benchmarks.report import main as report_main

PNG = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ results table
REFERENCE = """# targets

## A. Unified protocol: input length 96

ETTh1

| model | 96 | 192 |
|---|---|---|
| DLinear | 0.386 / 0.400 | 0.437 / 0.432 |

Exchange (70/10/20 split)

| model | 96 | 192 |
|---|---|---|
| DLinear | 0.088 / 0.218 | 0.176 / 0.315 |

## B. Other settings

| model (setting) | 96 | source |
|---|---|---|
| DLinear (input 336) | 0.375 / 0.399 | paper |

## C. Timer-XL protocol: input 672, rolled out

| model | 96 | 192 |
|---|---|---|
| Timer-XL | 0.364 / 0.397 | 0.405 / 0.424 |
"""


def _record(model, data, pred_len, seed, mse, mae, **args):
    args = {"features": "M", "seq_len": 96, "data_path": "ETTh1.csv", "learning_rate": 0.0001, "batch_size": 32,
            "lradj": "type1", "des": "Exp", **args}
    return {"setting": f"{model}_{pred_len}", "model": model, "data": data, "pred_len": pred_len, "seed": seed,
            "mse": mse, "mae": mae, "world_size": 1, "args": args}


def test_report_means_over_seeds_beside_published_figures(tmp_path, capsys):
    lines = [
        _record("DLinear", "ETTh1", 96, 1, 0.50, 0.50),  # replaced by the rerun of seed 1 below
        _record("DLinear", "ETTh1", 96, 2, 0.39, 0.41, embed="timeF"),  # run.py's default --embed: the Exp row
        _record("DLinear", "ETTh1", 96, 1, 0.38, 0.40),
        _record("DLinear", "ETTh1", 192, 1, 0.44, 0.43),
        _record("DLinear", "ETTh1", 96, 1, 0.45, 0.46, learning_rate=0.005),  # another lr: a row of its own
        _record("DLinear", "ETTh1", 96, 1, 0.47, 0.48, batch_size=16, lradj="TST"),  # another recipe: the same
        _record("DLinear", "ETTh1", 96, 1, 0.42, 0.43, des="no_marks"),  # a variant tagged with --des: the same
        _record("DLinear", "ETTh1", 96, 1, 0.43, 0.44, eval_batch_size=1),  # scored in batches of 1: the same
        _record("DLinear", "ETTh1", 96, 1, 0.44, 0.45, train_drop_last=True),  # other training steps: the same
        _record("DLinear", "ETTh1", 96, 1, 0.46, 0.47, embed="none"),  # no calendar inputs: the same
        _record("DLinear", "ETTh1", 96, 1, 0.30, 0.35, features="S"),  # S: no published figure
        _record("DLinear", "custom", 96, 1, 0.09, 0.21, data_path="exchange_rate.txt.gz"),
        # token model: trained on 96, rolled out to test_pred_len 192 from test_seq_len 672 (table C)
        _record("TimerXL", "ETTh1", 96, 1, 0.41, 0.43, seq_len=672, autoregressive=True, test_seq_len=672,
                test_pred_len=192),
    ]
    nested = tmp_path / "runs" / "day1"
    nested.mkdir(parents=True)
    (nested / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    reference = tmp_path / "targets.md"
    reference.write_text(REFERENCE)

    argv = [str(tmp_path / "runs"), "--reference", str(reference)]
    assert report_main(argv + ["--format", "csv", "--out", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "mse.png")]) == 0
    table = pd.read_csv(tmp_path / "t.csv")  # blank cells (no std, no published figure) read as NaN
    rows = {(r.data, r.features, r.input, r.model, r.horizon): r for r in table.itertuples()
            if (r.lr, r.batch, r.lradj, r.des) == (0.0001, 32, "type1", "Exp")}
    assert len(rows) == 5 and len(table) == 11
    other_lr = table[table.lr == 0.005]
    assert len(other_lr) == 1 and other_lr.mse.item() == pytest.approx(0.45) and other_lr.seeds.item() == 1
    other_recipe = table[table.lradj == "TST"]
    assert len(other_recipe) == 1 and other_recipe.batch.item() == 16 and other_recipe.mse.item() == pytest.approx(0.47)
    assert table[table.des == "no_marks"].mse.item() == pytest.approx(0.42)
    assert table[table.des == "Exp, eval batch 1"].mse.item() == pytest.approx(0.43)
    assert table[table.des == "Exp, train drop_last"].mse.item() == pytest.approx(0.44)
    assert table[table.des == "Exp, embed none"].mse.item() == pytest.approx(0.46)
    dl96 = rows[("ETTh1", "M", 96, "DLinear", 96)]
    assert dl96.seeds == 2 and dl96.mse == pytest.approx(0.385) and dl96.mae == pytest.approx(0.405)
    assert dl96.mse_std == pytest.approx(np.std([0.38, 0.39], ddof=1))
    assert (dl96.reference_protocol, dl96.reference_mse, dl96.reference_mae) == ("A", 0.386, 0.400)
    assert dl96.mse_vs_reference_pct == pytest.approx(100 * (0.385 - 0.386) / 0.386)
    single = rows[("ETTh1", "M", 96, "DLinear", 192)]
    assert single.seeds == 1 and np.isnan(single.mse_std) and single.reference_mse == 0.437
    assert rows[("exchange_rate", "M", 96, "DLinear", 96)].reference_mse == 0.088  # 'Exchange' caption
    assert np.isnan(rows[("ETTh1", "S", 96, "DLinear", 96)].reference_mse)
    timer = rows[("ETTh1", "M", 672, "TimerXL", 192)]
    assert (timer.reference_protocol, timer.reference_mse) == ("C", 0.405)
    assert (tmp_path / "mse.png").read_bytes()[:8] == PNG

    capsys.readouterr()
    assert report_main(argv) == 0
    markdown = capsys.readouterr().out
    assert "| ETTh1 | M | 96 | DLinear | 96 | 0.0001 | 32 | type1 | Exp | 0.3850 ± 0.0071 | 0.4050 ± 0.0071 | 2 | 0.386 / 0.400 (A) | -0.3% |" in markdown
    assert "1 record(s) replaced by a later run of the same seed" in markdown
    assert report_main([str(tmp_path / "nothing_here")]) == 2


# ------------------------------------------------------------------ reproduce.py
def test_reproduce_shows_the_pythonpath_its_runs_saw(monkeypatch):
    """A folder on PYTHONPATH changes what every run computes (lab/tf32), so reproduce.py's
    table shows it before the command."""
    from benchmarks.reproduce import shown_command

    monkeypatch.setattr(sys, "argv", ["benchmarks/reproduce.py", "--models", "TimesNet", "--extra", "--des tf32"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert shown_command() == "benchmarks/reproduce.py --models TimesNet --extra '--des tf32'"
    monkeypatch.setenv("PYTHONPATH", "lab/tf32")
    assert shown_command() == "PYTHONPATH=lab/tf32 benchmarks/reproduce.py --models TimesNet --extra '--des tf32'"


def test_report_into_replaces_the_table_and_keeps_the_prose(tmp_path, capsys):
    """--into rewrites a results document's table and the notes under it, and nothing else;
    run twice it changes nothing; a document without exactly one table is refused."""
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(_record("DLinear", "ETTh1", 96, seed, mse, 0.4)) + "\n"
                                                    for seed, mse in ((1, 0.38), (2, 0.39))))
    reference = tmp_path / "targets.md"
    reference.write_text(REFERENCE)
    doc = tmp_path / "summary.md"
    before, after = "# Summary\n\nProse before the table.\n\n", "\n\n- a note after the table\n"
    doc.write_text(before + "| data | features | input | model | stale |\n|---|\n| stale row |\n\n"
                   "MSE / MAE: mean of old runs\nPublished: somewhere\n3 record(s) replaced by a later run of the same seed."
                   + after)
    argv = [str(tmp_path / "results.jsonl"), "--reference", str(reference), "--overwrite", "--into", str(doc)]
    assert report_main(argv) == 0
    text = doc.read_text()
    assert text.startswith(before + "| data | features | input | model | horizon |") and text.endswith(after)
    assert "stale" not in text and "old runs" not in text and "record(s) replaced" not in text
    assert "| ETTh1 | M | 96 | DLinear | 96 | 0.0001 | 32 | type1 | Exp | 0.3850 ± 0.0071 |" in text
    assert report_main(argv) == 0 and doc.read_text() == text

    doc.write_text("# no table here\n")
    assert report_main(argv) == 2
    assert "holds 0 results tables" in capsys.readouterr().err
    assert report_main(argv[:-1] + [str(tmp_path / "missing.md")]) == 2
    assert "missing.md not found" in capsys.readouterr().err


def test_report_replaces_no_existing_file_without_overwrite(tmp_path, capsys):
    """--into rewrites a (usually committed) document in place and --out / --plot may name an existing
    file: each needs --overwrite, and is refused with one line before any work; a missing --reference
    is one line too."""
    (tmp_path / "results.jsonl").write_text(json.dumps(_record("DLinear", "ETTh1", 96, 1, 0.38, 0.4)) + "\n")
    doc = tmp_path / "summary.md"
    doc.write_text("# Summary\n\n| data | features | input | model | stale |\n")
    results = [str(tmp_path / "results.jsonl"), "--reference", ""]
    for argv, refusal in (
            (["--into", str(doc)], f"--into {doc} would rewrite that file in place; add --overwrite to do so"),
            (["--out", str(doc)], f"--out {doc} exists; add --overwrite to replace it"),
            (["--plot", str(doc)], f"--plot {doc} exists; add --overwrite to replace it")):
        assert report_main(results + argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {refusal}") and err.count("\n") == 1
        assert doc.read_text() == "# Summary\n\n| data | features | input | model | stale |\n"
    assert report_main(results + ["--out", str(doc), "--overwrite"]) == 0
    assert doc.read_text().startswith("| data | features | input | model | horizon |")
    assert report_main(results + ["--out", str(tmp_path / "new.md")]) == 0  # a new file needs no flag

    assert report_main([str(tmp_path / "results.jsonl"), "--reference", str(tmp_path / "targets.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --reference {tmp_path / 'targets.md'} not found;") and err.count("\n") == 1


def test_report_default_reference_is_found_beside_the_checkout():
    """The default published tables are looked for beside the repository checkout that holds
    benchmarks/, not beside an installed package (benchmarks/ is never installed)."""
    from benchmarks import report

    repo = Path(__file__).resolve().parents[1]
    assert report.TARGETS == repo.parent / "shared" / "reference" / "targets.md"


def test_bench_train_refuses_to_replace_its_committed_table_before_running(tmp_path, monkeypatch):
    """bench_train.py writes bench_train_<device>_<models>.md, a committed file in its default folder: an
    existing one is refused with one line before any configuration runs, unless --overwrite."""
    from benchmarks import bench_train

    existing = bench_train.output_path(tmp_path, "DLinear")
    existing.write_text("committed table\n")
    monkeypatch.setattr(bench_train, "run_one", lambda *args: pytest.fail("ran a configuration"))
    argv = ["--models", "DLinear", "--data", "synthetic", "--out", str(tmp_path), "--rounds", "1"]
    with pytest.raises(SystemExit, match=f"^error: {re.escape(str(existing))} exists; add --overwrite to replace it"):
        bench_train.main(argv)
    assert existing.read_text() == "committed table\n"
    measured = {"epoch_seconds": [2.0, 1.0], "eval_seconds": 0.5, "peak_mb": 1.0, "device": "cpu", "train_windows": 100}
    monkeypatch.setattr(bench_train, "run_one", lambda *args: dict(measured))
    bench_train.main(argv + ["--overwrite"])
    assert existing.read_text().startswith("# Training speed:")
    default = bench_train.output_path(bench_train.REPO / "benchmarks" / "results", "DLinear")
    assert default.name == existing.name and default.parent.name == "results"


def test_every_module_mutation_testing_mutates_has_targeted_tests():
    from benchmarks.mutation import REPO, _module_paths, targets_for

    for root in _module_paths():
        modules = [root] if root.endswith(".py") else sorted(
            str(p.relative_to(REPO)) for p in (REPO / root).rglob("*.py"))
        for module in modules:
            if (REPO / module).read_text().strip():  # an empty __init__.py has nothing to mutate
                assert all((REPO / test).exists() for test in targets_for(module)), module


# ------------------------------------------------------------------ bench_models.py
def test_bench_models_takes_each_models_arguments_from_its_script():
    """The table follows the scripts: TiDE's flags as TiDE_ETTh1.sh passes them at horizon 96, and for a
    protocol-C script (which first runs `python -c` to name its runs) the training run, not the roll-outs."""
    from benchmarks.bench_models import _flag, script_arguments

    tide = script_arguments("TiDE")
    assert [_flag(tide, f) for f in ("--batch_size", "--c_out", "--d_model", "--pred_len", "--model")] == [
        "512", "8", "256", "96", "TiDE"]
    timerxl = script_arguments("TimerXL")
    assert (_flag(timerxl, "--is_training"), _flag(timerxl, "--pred_len"), _flag(timerxl, "--seq_len")) == ("1", "96", "672")
    assert "--checkpoint" not in timerxl


def test_products_alone_replays_every_counted_product_of_a_step():
    """ProductsAlone records a training step's matrix products and convolutions (forward and backward,
    strided operands included) and replays them on fresh tensors of the same layout: the replay counts
    the step's FLOPs exactly, and runs nothing else."""
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.bench_models import ProductsAlone, step_flops

    conv = torch.nn.Conv1d(3, 8, 5)
    weight = torch.randn(24, 16, requires_grad=True)

    def step():
        x = torch.randn(4, 3, 40)
        hidden = conv(x).transpose(1, 2).reshape(-1, 8)  # a strided operand's product below
        loss = ((torch.relu(hidden @ weight[:8, :8]) ** 2).sum()
                + torch.addmm(weight[:, 0], x.view(12, 40)[:, :16], weight.t()).sum())
        loss.backward()

    alone = ProductsAlone(step)
    assert {func.__name__.split(".")[0] for func, _, _ in alone.calls} >= {"convolution", "convolution_backward",
                                                                           "mm", "addmm"}
    with FlopCounterMode(display=False) as replayed:
        alone()
    assert replayed.get_total_flops() == ProductsAlone.REPEATS * step_flops(step) > 0


def test_a_tslib_model_that_imports_a_missing_package_is_named_in_one_line(tmp_path):
    """TSLib's layers import its requirements (reformer_pytorch, ...): without them, one line naming the package."""
    from benchmarks.bench_models import model_class_from
    from utils.errors import UserError

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "iTransformer.py").write_text("import a_package_nobody_installed\n")
    with pytest.raises(UserError, match=r"iTransformer.py needs a_package_nobody_installed: pip install the "
                                        r"requirements of .*, or leave that variant out"):
        model_class_from(tmp_path, "iTransformer")
    import models.iTransformer  # noqa: F401  our package is ours again

    assert Path(sys.modules["models.iTransformer"].__file__).parent == Path(__file__).resolve().parents[1] / "models"


def test_bench_models_times_ours_beside_a_tslib_checkouts_model(tmp_path):
    """One round of DLinear against a stand-in TSLib checkout's DLinear (imported from there): the table
    has the step times, the FLOPs and the shares, and TSLib's loop trained the stand-in."""
    import subprocess

    checkout = tmp_path / "Time-Series-Library"
    (checkout / "models").mkdir(parents=True)
    (checkout / "models" / "__init__.py").write_text("")
    (checkout / "models" / "DLinear.py").write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self, configs):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(configs.seq_len, configs.pred_len)\n"
        "        self.marker = open(%r, 'a')\n"
        "    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec):\n"
        "        assert x_dec.shape[1] == 48 + 96 and x_mark_dec is not None\n"
        "        self.marker.write('step\\n'); self.marker.flush()\n"
        "        return self.linear(x_enc.transpose(1, 2)).transpose(1, 2)\n" % str(tmp_path / "tslib_steps"))
    # --baseline: another checkout of this repository (an earlier commit), its model trained by our loop
    baseline = tmp_path / "earlier"
    (baseline / "models").mkdir(parents=True)
    (baseline / "models" / "__init__.py").write_text("")
    (baseline / "models" / "DLinear.py").write_text(
        (checkout / "models" / "DLinear.py").read_text().replace("tslib_steps", "baseline_steps")
        .replace("x_enc, x_mark_enc, x_dec, x_mark_dec", "x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None")
        .replace("assert x_dec.shape[1] == 48 + 96 and x_mark_dec is not None", "assert x_dec is None"))
    out = tmp_path / "table.md"
    done = subprocess.run([sys.executable, "benchmarks/bench_models.py", "--models", "DLinear", "--variants",
                           "eager,baseline,tslib", "--tslib", str(checkout), "--baseline", str(baseline),
                           "--ablate", "--moving_avg 13", "--steps", "2",
                           "--rounds", "1", "--root_path", str(tmp_path / "nowhere"), "--out", str(out), "--device",
                           "cpu"], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| DLinear")]
    assert len(rows) == 1, out.read_text()
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "script: batch 32" and float(cells[2]) > 0 and float(cells[3]) > 0
    assert re.fullmatch(r"[\d.]+ \(\d+ %\)", cells[6])  # products alone
    assert all(re.fullmatch(r"[\d.]+ \([\d.]+x\)", cell) for cell in cells[7:10])
    assert cells[10].endswith("%") and "(" in cells[11]
    assert "| eager --moving_avg 13 ms |" in out.read_text()  # --ablate: the step with those flags, a column
    assert "synthetic" in out.read_text()
    assert len((tmp_path / "tslib_steps").read_text().split()) >= 3 + 2  # warm-up and timed steps
    assert len((tmp_path / "baseline_steps").read_text().split()) >= 3 + 2
    again = subprocess.run([sys.executable, "benchmarks/bench_models.py", "--out", str(out)],
                           cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "pass --overwrite" in again.stderr
    wrong = subprocess.run([sys.executable, "benchmarks/bench_models.py", "--ablate", "dropout 0", "--out",
                            str(tmp_path / "other.md")], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                           text=True, timeout=120)
    assert wrong.returncode == 2 and "--ablate takes strings of run.py flags" in wrong.stderr
    applied = subprocess.run([sys.executable, "benchmarks/bench_models.py", "--models", "DLinear", "--ablate",
                              "--moving_avg x", "--root_path", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o.md"),
                              "--device", "cpu"], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                             text=True, timeout=120)
    assert applied.returncode == 2 and "--moving_avg must be an integer" in applied.stderr  # the flags reach run.py's parser


def test_bench_models_breaks_a_step_down_call_by_call():
    """--breakdown: every ATen call of a step timed and sorted into products, element-wise work over large
    (4 MiB or more) and small tensors, views and the optimizer; the categories add up to the calls' time."""
    from benchmarks.bench_models import call_breakdown

    weight = torch.randn(64, 64, requires_grad=True)
    optimizer = torch.optim.Adam([weight], fused=True)

    def step():
        big = torch.randn(1 << 21)  # 8 MiB
        small = torch.randn(64, 64)
        loss = (small @ weight).t().relu().sum() + torch.cat([big, big]).mul(2.0).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    elapsed, categories, calls = call_breakdown(step, lambda: None, steps=2, top=50)
    names = dict(categories)
    assert set(names) == {"products", "views", "optimizer", "element-wise and copies, 4 MiB or more",
                          "element-wise and copies, smaller"}
    assert elapsed >= sum(names.values()) > 0
    assert any(call.startswith("mm [[64, 64], [64, 64]]") for call, _, _ in calls)
    assert any(call.startswith("cat [[2097152], [2097152]]") and count == 1 for call, _, count in calls)


# ------------------------------------------------------------------ results_page.py
def test_the_results_page_is_the_datas():
    """benchmarks/results/README.md is what `python -m benchmarks.results_page write` makes of the stored results."""
    from benchmarks import results_page

    assert results_page.main(["check"]) == 0, "python -m benchmarks.results_page write"
    page = results_page.PAGE.read_text()
    for folder in results_page.FOLDERS:
        for path, record in results_page.stored(folder):
            assert f"`{path.relative_to(folder).with_suffix('').as_posix()}`, data:" in page
            for block in record["blocks"]:
                assert "text" in block or (path.parent / block["table"]).is_file()
        for note in results_page.notes(folder):
            assert f"]({results_page.link(note)})" in page


def test_a_stored_result_gives_its_markdown_back_and_a_changed_figure_shows(tmp_path, monkeypatch, capsys):
    """`add` keeps a result's tables as CSV and its text as JSON, giving the same markdown back; a figure changed in
    a CSV changes the page, and `check` says so; a stored result is replaced only on purpose."""
    from benchmarks import results_page

    results, page = tmp_path / "results", tmp_path / "results" / "README.md"
    results.mkdir()
    monkeypatch.setattr(results_page, "FOLDERS", (results,))
    monkeypatch.setattr(results_page, "PAGE", page)
    monkeypatch.setattr(results_page, "REPO", tmp_path)
    text = ("# Speed: DLinear\n\nOne process, 2 cores.\n\n| pipeline | s / epoch | note |\n|---|---|---|\n"
            "| ours, \"fp32\" | 0.227 | a, b |\n| floor | 0.178 | |\n\nMedians of 4 epochs.\n")
    (results / "speed.md").write_text(text)
    (results / "notes.md").write_text("# What we learnt\n\nProse.\n")
    assert results_page.main(["add", str(results / "speed.md")]) == 0
    assert not (results / "speed.md").exists()
    assert (results / "speed.csv").read_text() == 'pipeline,s / epoch,note\n"ours, ""fp32""",0.227,"a, b"\nfloor,0.178,\n'
    [(path, record)] = results_page.stored(results)
    assert results_page.render(record["blocks"], {"speed.csv": results_page.read_csv(results / "speed.csv")}) == text
    assert results_page.main(["check"]) == 0
    assert "| floor | 0.178 | |" in page.read_text() and "- [notes.md](notes.md): What we learnt" in page.read_text()

    (results / "speed.csv").write_text((results / "speed.csv").read_text().replace("0.227", "0.250"))
    assert results_page.main(["check"]) == 1
    assert "results_page write" in capsys.readouterr().err
    results_page.main(["write"])
    assert "| ours, \"fp32\" | 0.250 | a, b |" in page.read_text()

    (results / "speed.md").write_text(text)
    with pytest.raises(SystemExit, match="speed.json exists; pass --replace"):
        results_page.main(["add", str(results / "speed.md")])
    results_page.main(["add", str(results / "speed.md"), "--replace"])
    assert "0.227" in page.read_text()
    with pytest.raises(SystemExit, match="holds no table: keep it as a note"):
        results_page.main(["add", str(results / "notes.md")])
