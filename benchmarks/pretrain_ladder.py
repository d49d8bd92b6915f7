"""OpenLTM's workflow end to end, small enough for a CPU: pre-train a TimerXL on a synthetic multi-series
corpus, then evaluate it on ETTh1 zero-shot, fine-tuned on 5 % of the training windows (few-shot) and on
all of them (full-shot), beside the same model trained from scratch on the same windows.

    python benchmarks/pretrain_ladder.py [--etth1 ../shared/datasets/ETT-small/ETTh1.csv] [--nproc 2]

Every stage is a plain `run.py` command (printed as it runs), so the table can be reproduced by hand.
ETTh1 is read as OpenLTM's univariate benchmark reads it: each channel a series of its own, the ETT
borders kept (`--data univariate --data_path ETTh1.csv`), horizon 96 from a 672-step context.
Writes benchmarks/results/pretrain_ladder.md (an existing one only with --overwrite).
"""
import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from data_provider.synthetic import make_synthetic  # noqa: E402
from benchmarks.outputs import add_output_arguments, parse_with_outputs  # noqa: E402
from utils.files import atomic_write  # noqa: E402

MODEL = ["--model", "TimerXL", "--features", "S", "--seq_len", "672", "--input_token_len", "96",
         "--output_token_len", "96", "--test_seq_len", "672", "--test_pred_len", "96", "--d_model", "128",
         "--d_ff", "256", "--n_heads", "4", "--e_layers", "2", "--dropout", "0.1", "--batch_size", "32",
         "--quiet", "--no_plots"]


def run(work, nproc, *argv):
    """One run.py job; returns its results.jsonl record."""
    results = work / "results"
    command = [sys.executable, "run.py", *MODEL, *map(str, argv), "--checkpoints", str(work / "checkpoints"),
               "--results_dir", str(results)]
    if nproc > 1:
        command[2:2] = ["--ddp", "--nproc_per_node", str(nproc)]
    print("$", " ".join(command[1:]), flush=True)
    started = time.time()
    subprocess.run(command, cwd=REPO, check=True)
    record = json.loads((results / "results.jsonl").read_text().splitlines()[-1])
    record["seconds"] = time.time() - started
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--etth1", default=str(REPO.parent / "shared" / "datasets" / "ETT-small" / "ETTh1.csv"))
    parser.add_argument("--series_files", type=int, default=12, help="synthetic files of 7 channels each")
    parser.add_argument("--pretrain_steps", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=2, help="fine-tuning and from-scratch epochs")
    parser.add_argument("--nproc", type=int, default=1)
    add_output_arguments(parser, "pretrain_ladder.md", "/tmp/pretrain_ladder")
    options, work = parse_with_outputs(parser)
    corpus = work / "corpus"
    corpus.mkdir(parents=True)
    for i in range(options.series_files):  # other seeds than the built-in set's 2021
        make_synthetic(rows=6000, channels=7, seed=100 + i).to_csv(corpus / f"part{i:02d}.csv", index=False)
    etth1 = ["--data", "univariate", "--root_path", str(Path(options.etth1).parent), "--data_path",
             Path(options.etth1).name]
    tune = ["--train_epochs", options.epochs, "--learning_rate", 1e-4, "--lradj", "constant"]
    pretrain = run(work, options.nproc, "--data", "univariate", "--root_path", corpus, "--data_path", "*.csv",
                   "--model_id", "pretrain", "--train_steps", options.pretrain_steps, "--eval_steps", 200,
                   "--val_windows", 2000, "--learning_rate", 1e-3, "--lradj", "constant", "--warmup_steps", 50,
                   "--clip_grad", 1.0)
    weights = str(work / "checkpoints" / pretrain["setting"] / "checkpoint.pth")
    rows = [("zero-shot (pre-trained, no ETTh1 training)",
             run(work, options.nproc, *etth1, "--is_training", 0, "--pretrain_model_path", weights, "--model_id", "zero")),
            ("few-shot: fine-tuned on 5 % of ETTh1's windows",
             run(work, options.nproc, *etth1, *tune, "--adaptation", "--pretrain_model_path", weights,
                 "--subset_rand_ratio", 0.05, "--model_id", "few")),
            ("from scratch on the same 5 %",
             run(work, options.nproc, *etth1, *tune, "--learning_rate", 1e-3, "--subset_rand_ratio", 0.05,
                 "--model_id", "few_scratch")),
            ("full-shot: fine-tuned on every window",
             run(work, options.nproc, *etth1, *tune, "--adaptation", "--pretrain_model_path", weights,
                 "--model_id", "full")),
            ("from scratch on every window",
             run(work, options.nproc, *etth1, *tune, "--learning_rate", 1e-3, "--model_id", "full_scratch"))]
    shutil.rmtree(work, ignore_errors=True)
    lines = ["# Pre-train -> zero-shot -> few-shot -> full-shot (`benchmarks/pretrain_ladder.py`)", "",
             f"TimerXL (d_model 128, 2 layers, 672-step context, 96-step tokens) pre-trained for "
             f"{options.pretrain_steps} steps on {options.series_files * 7} synthetic series of 6,000 points "
             f"({pretrain['train_windows']:,} windows; {pretrain['seconds']:.0f} s), then ETTh1, each channel a series, "
             f"horizon 96, {options.epochs} epochs where trained, {options.nproc} process(es) on this 2-core CPU.", "",
             "| stage | ETTh1 train windows | test MSE | test MAE | seconds |", "|---|---|---|---|---|"]
    for name, record in rows:
        windows = f"{record['train_windows']:,}" if "train_windows" in record else "0"
        lines.append(f"| {name} | {windows} | {record['mse']:.4f} | {record['mae']:.4f} | {record['seconds']:.0f} |")
    text = "\n".join(lines) + "\n"
    atomic_write(options.out, lambda f: f.write(text), binary=False)
    print(text)


if __name__ == "__main__":
    main()
