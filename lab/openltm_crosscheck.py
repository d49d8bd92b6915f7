"""Our TimerXL and Timer against OpenLTM's, loaded from OpenLTM's own initial weights.

    git clone https://github.com/thuml/OpenLTM /path/to/OpenLTM
    python lab/openltm_crosscheck.py --openltm /path/to/OpenLTM --out lab/results/openltm_crosscheck.md

OpenLTM's `models/timer_xl.py` and `models/timer.py` (with its `layers/` and `utils/masking.py`) are
imported from the given checkout at run time (nothing of it is copied here; it needs `einops`). For each
shape below, OpenLTM's model is built, its initial state_dict saved with torch.save as OpenLTM saves
checkpoints, and that file loaded into ours through exp.adaptation.load_pretrained, the function
`--adaptation --pretrain_model_path` runs (utils/checkpoint.load_weights underneath, as `--checkpoint`):
the OpenLTM layout is recognised and converted in memory (utils/openltm.py). Then, on the same random
inputs:

  1. forecast: both models in eval mode; the largest |difference| of the outputs (every token's
     forecast, every variable). TimerXL runs with `timerxl_attention="openltm"`, the attention of
     OpenLTM's code; the paper's (our default) is measured beside it: the same on one variable, another
     function on several (rotary positions over the time index, the bias outside the scaling, the
     covariate mask);
  2. roll-out: our test-time roll-out (exp.forward.rollout) against OpenLTM's test loop (exp/
     exp_forecast.py `test`, written out below: drop the first input_token_len steps, append the last
     token's output_token_len forecast). Comparable when input_token_len == output_token_len; otherwise
     OpenLTM's window changes length at every step while ours keeps it, and the row says so;
  3. gradients: one training step's MSE on the same batch and targets (dropout 0: the two codebases draw
     their dropout masks differently), every parameter's gradient compared through the key table; the
     largest |difference| and the largest relative one (per parameter, difference norm / gradient norm).

Done when every forecast agrees to 1e-5.
"""
import argparse
import importlib
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.checkouts import packages_from  # noqa: E402
from utils import openltm  # noqa: E402
from utils.errors import UserError, require  # noqa: E402

TOLERANCE = 1e-5

# (model, e_layers, n_heads, d_model, d_ff, input_token_len, output_token_len, variables, covariate, use_norm,
#  activation). OpenLTM's rotary projection needs head_dim / 2 even (its RotaryProjection asserts it).
SHAPES = (
    ("TimerXL", 1, 1, 16, 32, 8, 8, 1, False, True, "relu"),
    ("TimerXL", 2, 2, 32, 64, 8, 8, 3, False, True, "relu"),
    ("TimerXL", 2, 2, 32, 64, 8, 8, 3, True, True, "relu"),
    ("TimerXL", 3, 4, 64, 128, 16, 16, 4, True, False, "gelu"),
    ("TimerXL", 3, 4, 64, 64, 16, 8, 2, False, True, "gelu"),
    ("TimerXL", 1, 4, 32, 96, 4, 12, 5, True, True, "relu"),
    ("TimerXL", 2, 3, 48, 32, 24, 24, 2, False, True, "relu"),
    ("Timer", 1, 1, 16, 32, 8, 8, 1, False, True, "relu"),
    ("Timer", 2, 2, 32, 64, 8, 8, 3, False, True, "gelu"),
    ("Timer", 3, 4, 64, 128, 16, 16, 2, False, False, "relu"),
    ("Timer", 2, 3, 48, 96, 16, 8, 1, False, True, "gelu"),
)
TOKENS = 6      # input tokens per window
BATCH = 4
HORIZON_TOKENS = 3.5  # roll-out length in output tokens (a part token: the last step is cut)


def openltm_modules(root):
    root = Path(root)
    for name in ("models/timer_xl.py", "models/timer.py", "layers/SelfAttention_Family.py", "utils/masking.py"):
        require((root / name).is_file(), f"--openltm {root} has no {name}: give the root of a thuml/OpenLTM checkout")
    with packages_from(root):
        try:
            modules = {"TimerXL": importlib.import_module("models.timer_xl"),
                       "Timer": importlib.import_module("models.timer")}
        except ImportError as exc:  # e.g. a models/ folder without __init__.py loses to our package
            raise UserError(f"cannot import OpenLTM's models from {root} ({exc}): do its models/, layers/ and "
                            "utils/ hold an __init__.py, and is einops installed?") from None
    for module in modules.values():
        require(Path(module.__file__).resolve().is_relative_to(root.resolve()),
                f"imported {module.__file__}, not {root}'s: does {root}/models hold an __init__.py?")
    return modules


def configs(shape, attention="openltm", flash=False):
    model, layers, heads, d_model, d_ff, token_in, token_out, _, covariate, use_norm, activation = shape
    return argparse.Namespace(
        input_token_len=token_in, output_token_len=token_out, d_model=d_model, n_heads=heads, d_ff=d_ff,
        e_layers=layers, dropout=0.0, activation=activation, covariate=covariate, use_norm=use_norm,
        output_attention=False, flash_attention=flash, timerxl_attention=attention)


def ours_from(theirs, shape, attention, folder):
    """Our model, loaded from OpenLTM's state_dict saved to a file, as a user's run loads it."""
    from exp.adaptation import load_pretrained
    from models.Timer import Model as Timer
    from models.TimerXL import Model as TimerXL

    path = Path(folder) / f"openltm_{shape[0]}.pth"
    torch.save(theirs.state_dict(), path)  # OpenLTM's exp: torch.save(self.model.state_dict(), path)
    ours = (TimerXL if shape[0] == "TimerXL" else Timer)(configs(shape, attention))
    load_pretrained(ours, str(path), torch.device("cpu"))
    return ours


def openltm_rollout(model, x, args):
    """OpenLTM's test loop (exp/exp_forecast.py test()): steps of output_token_len, each dropping the
    first input_token_len steps of the input and appending the last token's forecast."""
    steps = -(-args.test_pred_len // args.output_token_len)
    preds = []
    for _ in range(steps):
        if preds:
            x = torch.cat([x[:, args.input_token_len:, :], preds[-1]], dim=1)
        preds.append(model(x, None, None)[:, -args.output_token_len:, :])
    return torch.cat(preds, dim=1)[:, :args.test_pred_len]


def our_rollout(model, x, args):
    from exp.forward import rollout

    y = torch.zeros(x.shape[0], args.test_pred_len, x.shape[-1])
    return rollout(model, (x, y, None, None), args, x.device)[0]


def gradient_differences(theirs, ours, shape, x, generator):
    """(largest |difference| of any gradient element, |difference| / |gradient| over all parameters as one
    vector) after one MSE step on the same batch and targets. (Per parameter, a relative figure means
    nothing where the true gradient is 0, e.g. the key projection's bias of a plain causal attention:
    a shift of every score of a row, which softmax ignores; both sides are rounding noise there.)"""
    target = torch.randn(x.shape[0], TOKENS * shape[6], x.shape[-1], generator=generator)
    theirs.train(), ours.train()
    for model, out in ((theirs, lambda: theirs(x, None, None)), (ours, lambda: ours(x))):
        model.zero_grad()
        torch.nn.functional.mse_loss(out(), target).backward()
    grads = openltm.openltm_to_ours({k: p.grad for k, p in theirs.named_parameters()}, shape[0])
    differences = torch.cat([(p.grad - grads[name]).flatten() for name, p in ours.named_parameters()])
    reference = torch.cat([grads[name].flatten() for name, _ in ours.named_parameters()])
    theirs.eval(), ours.eval()
    return differences.abs().max().item(), (differences.norm() / reference.norm()).item()


def check(shape, modules, folder, seed):
    model, *_, variables, covariate, _, _ = shape
    cfg = configs(shape)
    torch.manual_seed(seed)
    theirs = modules[model].Model(cfg).eval()
    ours = ours_from(theirs, shape, "openltm", folder).eval()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, TOKENS * cfg.input_token_len, variables, generator=generator) * 2 + 1
    row = {"shape": shape}
    with torch.no_grad():
        row["forecast"] = (theirs(x, None, None) - ours(x)).abs().max().item()
        if model == "TimerXL":
            paper = ours_from(theirs, shape, "paper", folder).eval()
            row["paper"] = (theirs(x, None, None) - paper(x)).abs().max().item()
        args = argparse.Namespace(input_token_len=cfg.input_token_len, output_token_len=cfg.output_token_len,
                                  test_pred_len=int(HORIZON_TOKENS * cfg.output_token_len), model_inputs=(),
                                  features="M", covariate=False)
        theirs_out, ours_out = openltm_rollout(theirs, x, args), our_rollout(ours, x, args)
        row["rollout_comparable"] = cfg.input_token_len == cfg.output_token_len
        row["rollout"] = (theirs_out - ours_out).abs().max().item() if row["rollout_comparable"] else None
        row["rollout_steps"] = -(-args.test_pred_len // args.output_token_len)
    row["grad_abs"], row["grad_rel"] = gradient_differences(theirs, ours, shape, x, generator)
    return row


def flash_note(modules, folder, seed):
    """OpenLTM's --flash_attention path against ours (openltm kind), one and two heads, 3 variables."""
    lines = []
    for heads in (1, 2):
        shape = ("TimerXL", 2, heads, 32, 64, 8, 8, 3, False, True, "relu")
        torch.manual_seed(seed)
        theirs = modules["TimerXL"].Model(configs(shape, flash=True)).eval()
        ours = ours_from(theirs, shape, "openltm", folder).eval()
        x = torch.randn(BATCH, TOKENS * 8, 3, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            lines.append(f"n_heads {heads}: {(theirs(x, None, None) - ours(x)).abs().max().item():.3g}")
    return lines


def checkout_commit(root):
    try:
        done = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %cs"], capture_output=True,
                              text=True, timeout=30)
    except OSError:
        return "commit unknown"
    return f"commit {done.stdout.strip()}" if done.returncode == 0 and done.stdout.strip() else "commit unknown"


def fmt(value):
    return "n/a" if value is None else f"{value:.2e}"


def report(rows, flash, seconds, root):
    lines = ["# OpenLTM cross-check: TimerXL and Timer loaded from OpenLTM's initial weights", "",
             f"OpenLTM checkout {root}, {checkout_commit(root)}; `python lab/openltm_crosscheck.py --openltm "
             f"{root} --num_threads 1`.", "",
             f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {seconds:.0f} s; "
             f"{BATCH} windows of {TOKENS} input tokens each, dropout 0, float32 on the CPU. Each OpenLTM model's "
             "state_dict went through torch.save and `exp.adaptation.load_pretrained` (the `--pretrain_model_path` "
             "path; `--checkpoint` loads through the same `utils/checkpoint.load_weights`).", "",
             "Largest |difference| against OpenLTM's outputs: forecast = every token's forecast in eval mode (TimerXL "
             "with `timerxl_attention=\"openltm\"`); paper = the same weights in our default attention (the Timer-XL "
             "paper's); roll-out = our test roll-out against OpenLTM's test loop (n/a: input_token_len != "
             "output_token_len, where OpenLTM's window changes length every step and ours does not); gradients = "
             "one MSE step, the largest absolute difference of any element and the relative one, ||difference|| / "
             "||gradient|| over all parameters as one vector.", "",
             "| model | e_layers | n_heads | d_model | d_ff | tokens in/out | variables | covariate | use_norm | "
             "activation | forecast | paper | roll-out (steps) | grad abs | grad rel |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        model, layers, heads, d_model, d_ff, t_in, t_out, variables, covariate, use_norm, activation = row["shape"]
        rollout = f"{fmt(row['rollout'])} ({row['rollout_steps']})"
        lines.append(f"| {model} | {layers} | {heads} | {d_model} | {d_ff} | {t_in}/{t_out} | {variables} | "
                     f"{'on' if covariate else 'off'} | {'on' if use_norm else 'off'} | {activation} | "
                     f"{row['forecast']:.2e} | {fmt(row.get('paper'))} | {rollout} | {row['grad_abs']:.2e} | "
                     f"{row['grad_rel']:.2e} |")
    worst = max(row["forecast"] for row in rows)
    verdict = "every forecast agrees" if worst <= TOLERANCE else "SOME FORECASTS DISAGREE"
    lines += ["", f"Largest forecast difference over {len(rows)} shapes: {worst:.2e} ({verdict} to {TOLERANCE:g}). "
              "Largest roll-out difference: "
              f"{max(r['rollout'] for r in rows if r['rollout'] is not None):.2e}.", "",
              "OpenLTM's `--flash_attention` path (scaled_dot_product_attention with the bias unscaled, output "
              "[B, H, L, E] viewed as [B, L, H * E]) against ours, 3 variables: " + "; ".join(flash)
              + ". It is neither our kind: OpenLTM's released Timer-XL and its scripts use the default path, which "
              "the table checks."]
    return "\n".join(lines) + "\n", worst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--openltm", required=True, help="root of a thuml/OpenLTM checkout")
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--num_threads", type=int, default=None)
    p.add_argument("--out", default=None, help="also write the report to this markdown file")
    args = p.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    logging.getLogger("tsl").setLevel(logging.ERROR)  # loading into the paper's attention warns, as it should
    started = time.time()
    modules = openltm_modules(args.openltm)
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for i, shape in enumerate(SHAPES):
            rows.append(check(shape, modules, folder, args.seed + i))
            print(f"{shape}: forecast {rows[-1]['forecast']:.2e}, roll-out {fmt(rows[-1]['rollout'])}, "
                  f"grad {rows[-1]['grad_abs']:.2e}", flush=True)
        flash = flash_note(modules, folder, args.seed)
    text, worst = report(rows, flash, time.time() - started, args.openltm)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as error:
        sys.exit(f"error: {error}")
