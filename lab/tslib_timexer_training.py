"""Our TimeXer training against TSLib's own, step for step: same initial weights, same window order, no dropout.

    python lab/tslib_timexer_training.py --tslib /path/to/Time-Series-Library --data /path/to/ETT-small \
        [--pred_len 336] [--epochs 2] [--seed 2021] [--python /path/to/venv/bin/python] [--out FILE.md]

TSLib's data_provider imports sktime (and patoolib, datasets, reformer_pytorch, which its long-term path never
uses: empty stand-ins are written to the work folder, as lab/tslib_timexer_etth1.sh does). Give its
side a Python that imports sktime and the same torch: `python -m venv --system-site-packages V &&
V/bin/pip install sktime`, then `--python V/bin/python` (here: /work/venvs/sktime/bin/python).

Two processes, one thread each (OMP_NUM_THREADS=1), with TSLib's TimeXer ETTh1 settings at --pred_len
(scripts/long_term_forecast/ETT_script/TimeXer_ETTh1.sh, from TSLib's script of that name), --dropout 0 (no
masks to differ) and a patience larger than --epochs (no early stop):
  ours   run.main (run.py, one process, --num_threads 1, --log_steps 1 for every step's loss), with two
         observers: the model's state_dict when training starts, and the window indices of every step the
         training loader (data_provider.global_batches.GlobalBatches) hands out, per epoch;
  TSLib  TSLib's run.py (its parser, its defaults, its Exp_Long_Term_Forecast.train), run from the checkout
         (imported through sys.path in its own process, nothing copied here), with its model's initial
         state_dict replaced, strictly, by ours, and its train loader's sampler replaced by a batch sampler
         that yields our run's steps, epoch by epoch. Its loss function records each training step's loss,
         and each evaluation batch's loss and size, so that its own validation figure (the mean of per-batch
         means, over a SHUFFLED validation loader) is shown beside the sample-weighted mean our code reports.
         Its final test pass (checkpoint reload) is skipped: the per-epoch test loss is the train loop's.
The first batch's tensors are compared (data scaling, time features), then the step losses, side by side;
the first step where they differ at all, by more than 1e-6 and by more than 1e-5 (relative) is reported, with
the epochs' figures. --tslib_fused_adam runs TSLib's Adam with PyTorch's fused kernel, which ours uses
(exp.exp_basic.make_optimizer), to tell the optimizer's rounding from anything else. Both runs' files stay in
--work (a temporary folder otherwise, kept): given again, our run is reused and only TSLib's is run again;
--report_only compares what is there. At 336 an epoch takes 1.5 to 2 minutes a side on one CPU thread.
"""
import argparse
import csv
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
# TSLib's TimeXer_ETTh1.sh (and ours, from it) per horizon: e_layers, d_model, d_ff, batch_size
SETTINGS = {96: (1, 256, 2048, 4), 192: (2, 128, 2048, 4), 336: (1, 512, 1024, 16), 720: (1, 256, 1024, 16)}
PATIENCE = 1000  # larger than any --epochs: neither run stops early
SHIMS = {"patoolib.py": "", "datasets.py": "def load_dataset(*args, **kwargs):\n    raise RuntimeError('unused')\n",
         "reformer_pytorch.py": "class LSHSelfAttention:\n    pass\n"}


def common_args(args):
    """The script's lines both codes take, with dropout 0 and no early stop."""
    e_layers, d_model, d_ff, batch = SETTINGS[args.pred_len]
    return ["--task_name", "long_term_forecast", "--is_training", "1", "--root_path", str(args.data) + "/",
            "--data_path", "ETTh1.csv", "--model_id", f"ETTh1_96_{args.pred_len}", "--model", "TimeXer",
            "--data", "ETTh1", "--features", "M", "--seq_len", "96", "--label_len", "48",
            "--pred_len", str(args.pred_len), "--e_layers", str(e_layers), "--factor", "3", "--enc_in", "7",
            "--dec_in", "7", "--c_out", "7", "--d_model", str(d_model), "--d_ff", str(d_ff),
            "--batch_size", str(batch), "--des", "Exp", "--itr", "1", "--dropout", "0",
            "--train_epochs", str(args.epochs), "--patience", str(PATIENCE), "--learning_rate", "0.0001",
            "--n_heads", "8", "--patch_len", "16"]


# ---------------------------------------------------------------- ours (this repository's python)
def run_ours(args, work):
    sys.path.insert(0, str(REPO))
    import torch

    import exp.exp_forecast as exp_forecast
    import run as our_run
    from data_provider.global_batches import GlobalBatches

    orders, datasets = {}, {}
    steps = GlobalBatches.steps

    def recorded_steps(self, start=0, device=None):  # every step's windows, as training takes them
        for step in steps(self, start, device):
            orders.setdefault(self.epoch, []).append([int(i) for m in step for i in m])
            yield step
    GlobalBatches.steps = recorded_steps

    provider = exp_forecast.data_provider

    def kept_provider(run_args, flag, device=None):
        dataset, loader = provider(run_args, flag, device)
        datasets[flag] = dataset
        return dataset, loader
    exp_forecast.data_provider = kept_provider

    train = exp_forecast.Exp_Forecast.train

    def train_from_saved_start(self, setting):
        torch.save(self.raw_model.state_dict(), work / "initial.pt")
        return train(self, setting)
    exp_forecast.Exp_Forecast.train = train_from_saved_start

    argv = common_args(args) + ["--num_threads", "1", "--seed", str(args.seed), "--log_steps", "1", "--no_plots",
                                "--quiet", "--checkpoints", str(work / "ours_checkpoints"),
                                "--results_dir", str(work / "ours_results")]
    started = time.perf_counter()
    code = our_run.main(argv)
    if code:
        raise SystemExit(f"our run.py exited {code}")
    first = orders[1][0]
    torch.save({"orders": [orders[e] for e in sorted(orders)], "first_batch": datasets["train"].__getitems__(first),
                "seconds": time.perf_counter() - started}, work / "ours_orders.pt")


# ---------------------------------------------------------------- TSLib (the reference python, TSLib on sys.path)
class OurOrder:
    """A batch sampler that yields our run's steps: epoch k's on the k-th pass."""

    def __init__(self, epochs):
        self.epochs, self.passes = epochs, 0

    def __iter__(self):
        self.passes += 1
        return iter(self.epochs[self.passes - 1])

    def __len__(self):
        return len(self.epochs[max(self.passes - 1, 0)])  # the pass under way (TSLib reads it before the first)


def run_tslib(args, work):
    sys.path.insert(0, str(args.tslib))
    import torch
    from torch import nn, optim
    from torch.utils.data import DataLoader

    import exp.exp_long_term_forecasting as lt  # TSLib's module (ours is not on sys.path in this process)

    ours = torch.load(work / "ours_orders.pt", weights_only=False)
    record = {"steps": [], "lrs": [], "evals": [], "windows": [], "first_batch": None}
    Exp = lt.Exp_Long_Term_Forecast

    class RecordingMSE(nn.MSELoss):
        """TSLib's criterion, keeping each training step's loss and each evaluation batch's (loss, windows)."""

        def forward(self, pred, true):
            loss = super().forward(pred, true)
            if torch.is_grad_enabled():
                record["steps"].append(loss.item())
                record["lrs"].append(self.optimizer.param_groups[0]["lr"])
            else:  # and each window's own MSE: how much the one that lands in the last batch can move the mean
                record["evals"][-1].append((loss.item(), pred.shape[0]))
                record["windows"][-1].extend((pred - true).square().flatten(1).mean(1).tolist())
            return loss

    criterion = RecordingMSE()
    build_model, get_data, select_optimizer, vali = Exp._build_model, Exp._get_data, Exp._select_optimizer, Exp.vali

    def build_from_our_start(self):
        model = build_model(self)
        model.load_state_dict(torch.load(work / "initial.pt"), strict=True)  # every key, every shape
        return model

    def data_in_our_order(self, flag):
        data_set, loader = get_data(self, flag)
        if flag != "train":
            return data_set, loader
        sizes = {len(data_set), *(sum(map(len, epoch)) for epoch in ours["orders"])}
        assert sizes == {len(data_set)}, f"TSLib has {len(data_set)} training windows, our orders {sizes}"
        first = ours["orders"][0][0]  # collated as TSLib's loader collates
        theirs = next(iter(DataLoader(torch.utils.data.Subset(data_set, first), batch_size=len(first))))
        record["first_batch"] = first_batch_differences(ours["first_batch"], theirs, self.args.pred_len)
        return data_set, DataLoader(data_set, batch_sampler=OurOrder(ours["orders"]), num_workers=0)

    def optimizer(self):
        made = (optim.Adam(self.model.parameters(), lr=self.args.learning_rate, fused=True) if args.tslib_fused_adam
                else select_optimizer(self))
        criterion.optimizer = made
        return made

    def recorded_vali(self, vali_data, vali_loader, _criterion):
        record["evals"].append([])
        record["windows"].append([])
        return vali(self, vali_data, vali_loader, criterion)

    Exp._build_model, Exp._get_data, Exp._select_optimizer = build_from_our_start, data_in_our_order, optimizer
    Exp._select_criterion, Exp.vali = lambda self: criterion, recorded_vali
    Exp.test = lambda self, setting, test=0: None  # the checkpoint's test pass: not compared
    sys.argv = ["run.py"] + common_args(args) + ["--no_use_gpu", "--num_workers", "0",
                                                 "--checkpoints", str(work / "tslib_checkpoints") + "/"]
    started = time.perf_counter()
    runpy.run_path(str(args.tslib / "run.py"), run_name="__main__")
    record["seconds"] = time.perf_counter() - started
    (work / ("tslib_fused.json" if args.tslib_fused_adam else "tslib.json")).write_text(json.dumps(record))


def first_batch_differences(ours, theirs, pred_len):
    """Largest absolute differences of the first batch: inputs, targets' horizon, input time features."""
    x, y, x_mark = ours[0], ours[1], ours[2]
    bx, by, bx_mark = (t.float() for t in theirs[:3])
    return {"x": (x - bx).abs().max().item(), "y": (y[:, -pred_len:] - by[:, -pred_len:]).abs().max().item(),
            "x_mark": (x_mark - bx_mark).abs().max().item()}


# ---------------------------------------------------------------- the comparison (any python)
def relative(a, b):
    return abs(a - b) / abs(b) if b else float("inf")


def epochs_of(tslib, ours_steps, epochs):
    """Per epoch: TSLib's figures from its recorded losses, split at the epoch's step count."""
    per_epoch = len(ours_steps) // epochs
    rows = []
    for e in range(epochs):
        losses = tslib["steps"][e * per_epoch:(e + 1) * per_epoch]
        val, test = tslib["evals"][2 * e], tslib["evals"][2 * e + 1]
        rows.append({"train_batch_mean": sum(losses) / len(losses), "vali_batch_mean": batch_mean(val),
                     "vali_last": val[-1], "vali_noise": shuffle_noise(val, tslib["windows"][2 * e]),
                     "vali_weighted": weighted(val), "test_batch_mean": batch_mean(test),
                     "test_weighted": weighted(test), "lr": tslib["lrs"][e * per_epoch]})
    return rows


def shuffle_noise(pairs, window_losses):
    """The spread of TSLib's validation figure over its loader's shuffles. With k full batches of b windows and a
    last one of r, the mean of batch means is the sample-weighted mean W plus (M - W)(b - r) / (b (k + 1)), M the
    mean of the r windows that land last: for r = 1, one random window's deviation / 170.7 at 2545 windows and
    batch 16. Its standard deviation over shuffles is about sd(window losses) / sqrt(r) times that factor."""
    b, r, batches = pairs[0][1], pairs[-1][1], len(pairs)
    if r == b:
        return 0.0
    n = len(window_losses)
    mean = sum(window_losses) / n
    sd = (sum((x - mean) ** 2 for x in window_losses) / n) ** 0.5
    return sd / r ** 0.5 * (b - r) / (b * batches)


def batch_mean(pairs):
    return sum(loss for loss, _ in pairs) / len(pairs)


def weighted(pairs):
    return sum(loss * n for loss, n in pairs) / sum(n for _, n in pairs)


def first_apart(ours, theirs, bound):
    return next((i + 1 for i, (a, b) in enumerate(zip(ours, theirs)) if relative(a, b) > bound), None)


def report(args, work):
    tslib = json.loads((work / ("tslib_fused.json" if args.tslib_fused_adam else "tslib.json")).read_text())
    results = next((work / "ours_results").glob("*/metrics.json"))
    metrics = json.loads(results.read_text())
    history = [h for h in metrics["history"] if not h.get("partial_epoch")]
    with open(results.parent / "steps.csv", newline="") as f:
        step_rows = list(csv.DictReader(f))
    ours_steps = [float(r["train_loss"]) for r in step_rows]
    ours_lrs = [float(r["lr"]) for r in step_rows]
    theirs = epochs_of(tslib, ours_steps, args.epochs)
    per_epoch = len(ours_steps) // args.epochs
    lines = [f"steps per epoch: ours {per_epoch}, TSLib {len(tslib['steps']) // args.epochs}; "
             f"first batch, largest |ours - TSLib|: " + ", ".join(f"{k} {v:.1e}" for k, v in
                                                                 tslib["first_batch"].items()), ""]
    train, vali, test = ([f"| epoch | {head} |", "|" + " --- |" * (head.count("|") + 2)] for head in (
        "lr ours / TSLib | train loss, ours (sample-weighted, its log) | ours, mean of batch means | TSLib, mean of "
        "batch means (its log) | rel. diff. (batch means)",
        "ours (sample-weighted, early stopping's) | TSLib, sample-weighted | rel. diff. | TSLib's own (mean of "
        "batch means, shuffled loader; early stopping's) | TSLib's own against ours | TSLib's last batch: windows, "
        "loss | sd of TSLib's own over shuffles",
        "ours (sample-weighted) | TSLib, sample-weighted | rel. diff. | TSLib's epoch line (mean of batch means)"))
    for e, (h, t) in enumerate(zip(history, theirs)):
        steps = ours_steps[e * per_epoch:(e + 1) * per_epoch]
        ours_batch_mean = sum(steps) / len(steps)
        train.append(f"| {h['epoch']} | {ours_lrs[e * per_epoch]:.3g} / {t['lr']:.3g} | {h['train_loss']:.7f} | "
                     f"{ours_batch_mean:.7f} | {t['train_batch_mean']:.7f} | "
                     f"{relative(ours_batch_mean, t['train_batch_mean']):.1e} |")
        vali.append(f"| {h['epoch']} | {h['vali_loss']:.7f} | {t['vali_weighted']:.7f} | "
                    f"{relative(h['vali_loss'], t['vali_weighted']):.1e} | {t['vali_batch_mean']:.7f} | "
                    f"{(t['vali_batch_mean'] - h['vali_loss']) / h['vali_loss']:+.2%} | {t['vali_last'][1]}, "
                    f"{t['vali_last'][0]:.4f} | {t['vali_noise']:.4f} ({t['vali_noise'] / h['vali_loss']:.2%}) |")
        test.append(f"| {h['epoch']} | {h['test_loss']:.7f} | {t['test_weighted']:.7f} | "
                    f"{relative(h['test_loss'], t['test_weighted']):.1e} | {t['test_batch_mean']:.7f} |")
    lines += ["Training:", ""] + train + ["", "Validation loss (MSE):", ""] + vali + ["", "Test MSE:", ""] + test
    lines += ["", "| step | ours | TSLib | rel. |", "| --- | --- | --- | --- |"]
    shown = sorted({*range(1, min(args.steps, len(ours_steps)) + 1), len(ours_steps),
                    *(e * per_epoch + k for e in range(1, args.epochs) for k in (0, 1))})  # each epoch's ends
    for s in (s for s in shown if s <= min(len(ours_steps), len(tslib["steps"]))):
        a, b = ours_steps[s - 1], tslib["steps"][s - 1]
        lines.append(f"| {s} | {a:.8f} | {b:.8f} | {relative(a, b):.1e} |")
    gaps = [relative(a, b) for a, b in zip(ours_steps, tslib["steps"])]
    lines += ["", "step losses, largest relative difference: " + ", ".join(
        f"epoch {e + 1} {max(gaps[e * per_epoch:(e + 1) * per_epoch]):.1e}" for e in range(args.epochs))
        + f"; {sum(g > 0 for g in gaps)} of {len(gaps)} differ at all, the first at step "
        + str(first_apart(ours_steps, tslib["steps"], 0.0))
        + "; first step apart by more than 1e-6: " + str(first_apart(ours_steps, tslib["steps"], 1e-6))
        + ", by more than 1e-5: " + str(first_apart(ours_steps, tslib["steps"], 1e-5))
        + f"; wall time ours {ours_seconds(work):.0f} s, TSLib {tslib['seconds']:.0f} s (one thread each)"]
    return "\n".join(lines)


def ours_seconds(work):
    import torch

    return torch.load(work / "ours_orders.pt", weights_only=False)["seconds"]


def header(args):
    """What ran: the command, the date, both commits, this machine's torch."""
    import torch

    def commit(path):
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "unknown"
    command = (f"python lab/tslib_timexer_training.py --tslib TSLIB --data ETT-small --pred_len {args.pred_len} "
               f"--epochs {args.epochs} --seed {args.seed} --python VENV/bin/python"
               + (" --tslib_fused_adam" if args.tslib_fused_adam else ""))
    return (f"# TimeXer ETTh1-{args.pred_len}: our training against TSLib's own, same start, same order, dropout 0\n\n"
            f"`{command}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, this repository at "
            f"{commit(REPO)}, TSLib at {commit(args.tslib)}, torch {torch.__version__}, CPU, one thread a run.\n\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tslib", type=Path, required=True, help="root of a Time-Series-Library checkout")
    parser.add_argument("--data", type=Path, required=True, help="folder of ETTh1.csv")
    parser.add_argument("--pred_len", type=int, default=336, choices=sorted(SETTINGS))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2021, help="our run's --seed (weights and window order)")
    parser.add_argument("--steps", type=int, default=20, help="step losses shown from the first on")
    parser.add_argument("--python", default=sys.executable, help="TSLib's side: a Python that imports sktime")
    parser.add_argument("--tslib_fused_adam", action="store_true", help="TSLib's Adam with fused=True, as ours")
    parser.add_argument("--work", type=Path, help="keep the runs' files here (default: a temporary folder)")
    parser.add_argument("--out", help="also write the tables to this Markdown file")
    parser.add_argument("--report_only", action="store_true", help="only compare the runs kept in --work")
    parser.add_argument("--part", choices=["ours", "tslib"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.tslib, args.data = args.tslib.resolve(), args.data.resolve()
    if args.part:
        work = args.work
        return run_ours(args, work) if args.part == "ours" else run_tslib(args, work)
    work = args.work or Path(tempfile.mkdtemp(prefix="timexer_training_"))
    work.mkdir(parents=True, exist_ok=True)
    shims = work / "shims"
    shims.mkdir(exist_ok=True)
    for name, text in SHIMS.items():
        (shims / name).write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    tail = ["--work", str(work), "--tslib", str(args.tslib), "--data", str(args.data), "--pred_len",
            str(args.pred_len), "--epochs", str(args.epochs), "--seed", str(args.seed)]
    tail += ["--tslib_fused_adam"] if args.tslib_fused_adam else []
    if (work / "ours_orders.pt").exists():  # a kept --work folder: compare TSLib again (e.g. fused Adam) to that run
        print(f"our run: reusing {work / 'ours_orders.pt'} and {work / 'ours_results'}", flush=True)
    else:
        subprocess.run([sys.executable, str(HERE), "--part", "ours"] + tail, check=True, cwd=REPO, env=env)
    # TSLib finds its models by listing ./models: it runs in its checkout, writing only under --work
    if not args.report_only:
        subprocess.run([args.python, str(HERE), "--part", "tslib"] + tail, check=True, cwd=args.tslib,
                       env={**env, "PYTHONPATH": str(shims)})
    text = report(args, work)
    print(text)
    if args.out:
        Path(args.out).write_text(header(args) + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
