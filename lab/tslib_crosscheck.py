"""Our TimesNet against TSLib's, weight for weight, on real ETTh1 windows; and TSLib's own run, seed by seed.

    git clone https://github.com/thuml/Time-Series-Library /path/to/TSLib
    python lab/tslib_crosscheck.py --tslib /path/to/TSLib                  # --mode check
    python lab/tslib_crosscheck.py --tslib /path/to/TSLib --mode run --seed 2022

TSLib's `models/TimesNet.py` is imported from the given checkout (nothing of it is copied here) and
built with the ETTh1 script's settings right after seeding, as TSLib's run.py does; its initial weights
are loaded, strictly, into ours. Our TimesBlock pads a period grid's last row with `--padding`: zeros,
as TSLib's code has since fd74cbc (2023-02-22), or the series' last steps (tail), its 2023-02-18 code
(230805f). The checkout's own padding is read off its TimesBlock, and a different `--padding` refused.

--mode check:
  1. forward: both models in eval mode on `--batches` test batches; the largest difference of the
     forecasts;
  2. training: both trained side by side for `--steps` Adam steps on the same shuffled training
     batches, with the same dropout masks (the global RNG is reseeded before each forward, and each
     model has one dropout, on the same tensor); the training losses and the weights compared
     every `--report_every` steps, then both scored on the validation and test splits.
  If the two columns agree to rounding, a gap between our runs and a published figure lies outside
  the model's code.
--mode run: TSLib's long-term forecasting run for one seed, on the CPU: its initial weights, its
  random streams (torch DataLoaders shuffling train and validation windows, each drawing its order
  from the global generator), its validation score (the mean of per-batch losses), its early stopping
  (patience 3, ties count as improvements) and `type1` learning-rate halving, 10 epochs at batch 32
  and lr 1e-4, with TSLib's current loaders (nothing dropped; test batches of 32). The forward is
  ours (`--forward tslib` runs theirs: the same function, about 4x slower). Scored like TSLib's
  test: MSE / MAE over every test window. So a seed's result is what TSLib's code gives for it on
  this machine, and several seeds show where a published figure lies in TSLib's own seed spread.
"""
import argparse
import json
import random
import importlib
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.checkouts import packages_from  # noqa: E402
from utils.errors import UserError, require  # noqa: E402

# TSLib parameter name -> ours (the rest are spelled alike)
RENAMES = (("enc_embedding.value_embedding.tokenConv.", "enc_embedding.value.conv."),
           ("enc_embedding.temporal_embedding.embed.", "enc_embedding.temporal.linear."),
           ("model.", "blocks."))


def tslib_timesnet(tslib_root):
    root = Path(tslib_root)
    require((root / "models" / "TimesNet.py").is_file(),
            f"--tslib {tslib_root} has no models/TimesNet.py: give the root of a Time-Series-Library checkout")
    with packages_from(root):
        module = importlib.import_module("models.TimesNet")
    # A folder without __init__.py loses to our regular package of the same name: make sure it did not.
    require(Path(module.__file__).resolve().is_relative_to(root.resolve()),
            f"imported {module.__file__}, not {root}/models/TimesNet.py: does {root}/models hold an __init__.py?")
    return module


def checkout_padding(module):
    """"zeros" or "tail": what the checkout's TimesBlock appends to complete a period grid, seen by running
    it on a 10-step series whose one period (3) needs two more steps; None when that cannot be seen."""
    steps, period = 10, 3
    grids = []

    class Capture(nn.Module):
        def forward(self, grid):
            grids.append(grid)
            return grid

    t = torch.arange(steps, dtype=torch.float32)
    series = (5 + torch.cos(2 * np.pi * (steps // period) * t / steps)).reshape(1, steps, 1)  # no zero value
    try:  # external code of any age: an error here only means the padding cannot be read this way
        block = module.TimesBlock(argparse.Namespace(seq_len=steps - 3, pred_len=3, top_k=1, d_model=1, d_ff=1,
                                                     num_kernels=1))
        block.conv = Capture()
        with torch.no_grad():
            block(series)
        appended = grids[0].permute(0, 2, 3, 1).reshape(1, -1, 1)[:, steps:]
    except Exception:
        return None
    if appended.shape[1] != period - steps % period:
        return None
    if torch.all(appended == 0):
        return "zeros"
    if torch.equal(appended, series[:, -appended.shape[1]:]):
        return "tail"
    return None


def settings(args):
    """The ETTh1 TimesNet script's settings, as both codebases read them."""
    return argparse.Namespace(
        task_name="long_term_forecast", seq_len=96, label_len=48, pred_len=args.pred_len, enc_in=7, dec_in=7,
        c_out=7, d_model=16, d_ff=32, top_k=5, num_kernels=6, e_layers=2, d_layers=1, factor=3, dropout=0.1,
        embed="timeF", freq="h", mark_dim=4, times_padding=args.padding)


def renamed(state):
    """TSLib's state_dict under our parameter names."""
    out = {}
    for key, value in state.items():
        for theirs, ours in RENAMES:
            if key.startswith(theirs):
                key = ours + key[len(theirs):]
                break
        out[key] = value
    return out


def etth1_windows(args):
    """(train, val, test) as (x, y, x_mark) tensors over every window, from our data path."""
    from utils.arguments import parse_args
    from data_provider.data_factory import window_for
    from data_provider.splits import SPLITS
    from data_provider.table import prepare_table
    from data_provider.windows import WindowDataset

    run_args = parse_args(["--data", "ETTh1", "--root_path", args.root_path, "--data_path", "ETTh1.csv",
                           "--seq_len", "96", "--label_len", "48", "--pred_len", str(args.pred_len)])
    data = prepare_table(run_args)
    splits = []
    for split in SPLITS:
        window = window_for(run_args, split)
        start, stop = data.split_rows(split, window.x_len)
        windows = WindowDataset(data.values[start:stop], data.marks[start:stop], window, split)
        x, y, x_mark, _ = windows.__getitems__(range(len(windows)))
        splits.append((x, y[:, -args.pred_len:].contiguous(), x_mark))  # y also holds label_len rows
    return splits


def forecast(model, x, x_mark, pred_len, tslib):
    if tslib:  # TSLib's signature: (x_enc, x_mark_enc, x_dec, x_mark_dec); TimesNet reads the first two
        return model(x, x_mark, None, None)[:, -pred_len:]
    return model(x, x_mark)


def mse_over(model, split, pred_len, tslib, batch_size=32):
    x, y, x_mark = split
    total = 0.0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            out = forecast(model, x[start:start + batch_size], x_mark[start:start + batch_size], pred_len, tslib)
            total += ((out - y[start:start + batch_size]) ** 2).mean(dim=(1, 2)).sum().item()
    model.train()
    return total / len(x)


def build_models(args, theirs_module):
    """(TSLib's model, ours with its weights), built right after seeding every generator as TSLib's run.py."""
    from models.TimesNet import Model as Ours

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    configs = settings(args)
    theirs = theirs_module.Model(configs).float()
    state = torch.get_rng_state()
    ours = Ours(configs)
    torch.set_rng_state(state)  # our constructor's own draws must not shift the run's later shuffles and masks
    # strict apart from TSLib's persistent positional-encoding buffer, which ours recomputes
    weights = {k: v for k, v in renamed(theirs.state_dict()).items() if not k.endswith("position_embedding.pe")}
    ours.load_state_dict(weights, strict=True)
    return theirs, ours


def check(args, theirs, ours, splits):
    train, val, test = splits
    lines = [f"Forward and {args.steps} training steps side by side, seed {args.seed}, our padding {args.padding}", ""]
    theirs.eval(), ours.eval()
    worst = 0.0
    with torch.no_grad():
        for b in range(args.batches):
            x, _, x_mark = (t[b * 32:(b + 1) * 32] for t in test)
            worst = max(worst, (forecast(theirs, x, x_mark, args.pred_len, True)
                                - forecast(ours, x, x_mark, args.pred_len, False)).abs().max().item())
    lines += [f"Forward, {args.batches} test batches of 32, eval mode: largest |difference| {worst:.3g}", ""]

    optimisers = [torch.optim.Adam(m.parameters(), lr=1e-4) for m in (theirs, ours)]
    criterion = nn.MSELoss()
    order = torch.randperm(len(train[0]), generator=torch.Generator().manual_seed(args.seed))
    lines += ["| steps | TSLib's loss (mean) | ours (mean) | largest relative weight difference |",
              "|---|---|---|---|"]
    running = [[], []]
    theirs.train(), ours.train()
    for step in range(args.steps):
        index = order[(step * 32) % len(order):][:32]
        x, y, x_mark = (t[index] for t in train)
        for k, (model, optimiser) in enumerate(zip((theirs, ours), optimisers)):
            torch.manual_seed(args.seed * 100003 + step)  # the same dropout mask for both
            optimiser.zero_grad()
            loss = criterion(forecast(model, x, x_mark, args.pred_len, k == 0), y)
            loss.backward()
            optimiser.step()
            running[k].append(loss.item())
        if (step + 1) % args.report_every == 0 or step + 1 == args.steps:
            mine = dict(ours.named_parameters())
            drift = max(((mine[name] - value).norm() / value.norm()).item()
                        for name, value in renamed(dict(theirs.named_parameters())).items())
            lines.append(f"| {step + 1} | {np.mean(running[0]):.6f} | {np.mean(running[1]):.6f} | {drift:.2e} |")
            running = [[], []]
            print(lines[-1], flush=True)
    scores = [f"{mse_over(model, split, args.pred_len, k == 0):.6f}" for split in (val, test)
              for k, model in enumerate((theirs, ours))]
    lines += ["", f"After {args.steps} steps: validation MSE TSLib's {scores[0]}, ours {scores[1]}; "
                  f"test MSE TSLib's {scores[2]}, ours {scores[3]}"]
    return lines, {}


def tslib_run(args, theirs, ours, splits):
    """TSLib's Exp_Long_Term_Forecast.train + test for one seed (see the module docstring)."""
    from torch.utils.data import DataLoader, TensorDataset

    use_theirs = args.forward == "tslib"
    model = theirs if use_theirs else ours

    def loader(split, shuffle):  # each shuffled loader draws its order from the global generator, as TSLib's
        return DataLoader(TensorDataset(*split), batch_size=32, shuffle=shuffle)

    train_loader, val_loader, test_loader = loader(splits[0], True), loader(splits[1], True), loader(splits[2], False)
    criterion = nn.MSELoss()
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-4)

    def batch_averaged(data):  # TSLib's vali(): np.average over batches, whatever their sizes
        model.eval()
        with torch.no_grad():
            losses = [criterion(forecast(model, x, x_mark, args.pred_len, use_theirs), y).item()
                      for x, y, x_mark in data]
        model.train()
        return float(np.mean(losses))

    lines = [f"TSLib's run, seed {args.seed}, forward {args.forward}, padding {args.padding}", "",
             "| epoch | train loss | vali loss | test loss | seconds |", "|---|---|---|---|---|"]
    best, best_state, waited, epochs = None, None, 0, []
    for epoch in range(10):
        started = time.time()
        model.train()
        losses = []
        for x, y, x_mark in train_loader:
            optimiser.zero_grad()
            loss = criterion(forecast(model, x, x_mark, args.pred_len, use_theirs), y)
            losses.append(loss.item())
            loss.backward()
            optimiser.step()
        vali, test = batch_averaged(val_loader), batch_averaged(test_loader)
        epochs.append([float(np.mean(losses)), vali, test])
        lines.append(f"| {epoch + 1} | {np.mean(losses):.7f} | {vali:.7f} | {test:.7f} | {time.time() - started:.0f} |")
        print(lines[-1], flush=True)
        if best is None or -vali >= best:  # TSLib's EarlyStopping: a tie counts as an improvement
            best, waited = -vali, 0
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            waited += 1
            if waited >= 3:
                break
        for group in optimiser.param_groups:  # type1: halve after every epoch
            group["lr"] = 1e-4 * 0.5 ** epoch  # TSLib: 0.5 ** (epoch - 1) of the 1-based epoch + 1
    model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        pairs = [(forecast(model, x, x_mark, args.pred_len, use_theirs), y) for x, y, x_mark in test_loader]
    errors = torch.cat([p - t for p, t in pairs])
    mse, mae = (errors ** 2).mean().item(), errors.abs().mean().item()
    lines += ["", f"Test over {len(errors)} windows: mse {mse:.6f}, mae {mae:.6f}"]
    record = dict(seed=args.seed, forward=args.forward, padding=args.padding, mse=mse,
                  mae=mae, epochs=epochs, torch=torch.__version__)
    return lines, record


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tslib", required=True, help="root of a thuml/Time-Series-Library checkout")
    p.add_argument("--mode", choices=("check", "run"), default="check")
    p.add_argument("--root_path", default=str(REPO.parent / "shared" / "datasets" / "ETT-small"))
    p.add_argument("--pred_len", type=int, default=96)
    p.add_argument("--seed", type=int, default=2021)
    p.add_argument("--padding", choices=("zeros", "tail"), default="zeros",
                   help="our TimesBlock padding: zeros (TSLib's code since fd74cbc, 2023-02-22) or tail (its "
                        "2023-02-18 code, 230805f); a checkout whose padding differs is refused")
    p.add_argument("--batches", type=int, default=20, help="check: test batches (of 32) for the forward check")
    p.add_argument("--steps", type=int, default=264, help="check: training steps (264: an epoch at batch 32)")
    p.add_argument("--report_every", type=int, default=44)
    p.add_argument("--forward", choices=("ours", "tslib"), default="ours", help="run: whose forward trains")
    p.add_argument("--num_threads", type=int, default=None)
    p.add_argument("--out", default=None, help="also write the report to this markdown file (run: and a .json)")
    args = p.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)

    theirs_module = tslib_timesnet(args.tslib)
    detected = checkout_padding(theirs_module)
    require(detected in (None, args.padding),
            f"{args.tslib}'s TimesNet pads period grids with {detected}, not {args.padding}: "
            f"pass --padding {detected}, or the comparison measures the padding, not the code")
    if detected is None:
        print(f"warning: could not read {args.tslib}'s padding; trusting --padding {args.padding}", flush=True)
    started = time.time()
    theirs, ours = build_models(args, theirs_module)
    splits = etth1_windows(args)
    lines, record = (check if args.mode == "check" else tslib_run)(args, theirs, ours, splits)
    head = [f"# TimesNet, ETTh1 96 -> {args.pred_len}: ours against TSLib's ({args.tslib})", "",
            f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {time.time() - started:.0f} s; "
            f"the checkout's padding: {detected or 'not detected'}", ""]
    report = "\n".join(head + lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
        if record:
            Path(args.out).with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    except UserError as error:
        sys.exit(f"error: {error}")
