"""Our models/TimeXer.py against TSLib's models/TimeXer.py, weight for weight.

    python lab/tslib_timexer.py --tslib /path/to/Time-Series-Library [--out FILE.md]

TSLib's file is imported from the checkout (nothing of it copied here; packages it does not need are stubbed
as lab/tslib_layers.py stubs them). For each configuration (--features M and MS, with and without time
features, one and two layers, a seq_len that patch_len does not divide) both models are built right after
the same seed: ours must draw TSLib's initial weights (the same keys, equal tensors). TSLib's state_dict is
then loaded into ours strictly, both run in eval mode on the same windows, and the forecasts and the
parameter gradients of a squared-forecast loss are compared (largest relative difference; the attention key
projections' biases, whose gradient is zero up to rounding, are left out). Input gradients are not taken:
TSLib normalises x_enc in place, which autograd refuses for an input that requires a gradient.
"""
import argparse
import sys
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from lab.tslib_layers import tslib_modules  # noqa: E402
from models.TimeXer import Model  # noqa: E402
from utils.errors import UserError  # noqa: E402

# (features, channels, time features, e_layers, d_model, heads, seq_len, patch_len)
CONFIGS = [("M", 7, 4, 2, 32, 4, 96, 16), ("MS", 7, 4, 1, 64, 8, 96, 16), ("MS", 3, 0, 2, 16, 2, 50, 8),
           ("M", 1, 3, 1, 32, 8, 48, 12)]
TOLERANCE = 1e-5


def configs(features, channels, e_layers, d_model, heads, seq_len, patch_len):
    return types.SimpleNamespace(task_name="long_term_forecast", features=features, covariate=False, seq_len=seq_len,
                                 pred_len=24, use_norm=1, patch_len=patch_len, enc_in=channels, d_model=d_model,
                                 n_heads=heads, d_ff=48, e_layers=e_layers, dropout=0.0, factor=3, embed="timeF",
                                 freq="h", activation="gelu")


def _relative(theirs, ours):
    return ((theirs - ours).abs().max() / theirs.abs().max()).item()


def compare(theirs_class, row):
    features, channels, marks, e_layers, d_model, heads, seq_len, patch_len = row
    cfg = configs(features, channels, e_layers, d_model, heads, seq_len, patch_len)
    torch.manual_seed(0)
    theirs = theirs_class(cfg).eval()
    torch.manual_seed(0)
    ours = Model(cfg).eval()
    theirs_state, fresh = theirs.state_dict(), ours.state_dict()
    same_init = theirs_state.keys() == fresh.keys() and all(torch.equal(theirs_state[k], fresh[k]) for k in fresh)
    ours.load_state_dict(theirs_state, strict=True)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, seq_len, channels, generator=generator)
    x_mark = torch.randn(5, seq_len, marks, generator=generator) if marks else None
    their_out, our_out = theirs(x, x_mark, None, None), ours(x, x_mark)
    their_out.square().sum().backward()
    our_out.square().sum().backward()
    theirs_params = dict(theirs.named_parameters())
    grads = max(_relative(theirs_params[name].grad, param.grad) for name, param in ours.named_parameters()
                if not name.endswith("key_projection.bias"))
    return same_init, tuple(our_out.shape), _relative(their_out, our_out), grads


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tslib", required=True, help="root of a Time-Series-Library checkout")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    theirs_class = tslib_modules(args.tslib, ["models.TimeXer"])["models.TimeXer"].Model
    lines = ["| features | C | marks | e_layers | d_model | heads | seq_len | patch | same initial weights | output "
             "| forecast rel. diff | gradients rel. diff | pass |", "|" + " --- |" * 13]
    failed = False
    for row in CONFIGS:
        same_init, shape, out, grads = compare(theirs_class, row)
        ok = same_init and out <= TOLERANCE and grads <= TOLERANCE
        failed |= not ok
        lines.append("| " + " | ".join(map(str, row)) + f" | {same_init} | {list(shape)} | {out:.1e} | {grads:.1e} | "
                     f"{'pass' if ok else 'FAIL'} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(f"# models/TimeXer.py against TSLib's (`python lab/tslib_timexer.py "
                                  f"--tslib PATH`)\n\nTolerance {TOLERANCE} (float32).\n\n{text}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as error:
        sys.exit(f"error: {error}")
