"""Fine-tuning from a pre-trained checkpoint: OpenLTM's `--adaptation --pretrain_model_path PATH`,
optionally few-shot on a random fraction of the training windows (`--subset_rand_ratio`). PATH is a
checkpoint of ours or of OpenLTM's Timer-XL / Timer (.pth, .safetensors or a model.safetensors folder):
docs/openltm.md.

Also here: a released foundation model sees the user's series as given (`series_as_given`), whatever
--scale did to the data, so its zero-shot forecast is its package's forecast of that series."""
import logging
import os

import torch

from data_provider.data_factory import prepared_data
from data_provider.few_shot import check_subset_ratio
from models.foundation import export_formats
from models.foundation.release import open_release
from utils import ddp
from utils.checkpoint import load_weights
from utils.errors import UserError, require

logger = logging.getLogger("tsl")


def check_adaptation_args(args):
    """Reject contradictory fine-tuning arguments before any data is read."""
    check_subset_ratio(args.subset_rand_ratio)
    require(not args.adaptation or args.pretrain_model_path,
            "--adaptation needs --pretrain_model_path PATH (the checkpoint.pth of a pre-training run)")
    require(args.adaptation or not args.pretrain_model_path,
            "--pretrain_model_path is only read with --adaptation; add --adaptation to fine-tune from it")


def load_pretrained(model, path, device):
    """Strictly load `path` into `model` as best checkpoints are loaded (the model's own keys, or a
    foreign layout its checkpoint_adapters read, converted in memory: utils/checkpoint.weights_for): rank 0 reads the file and
    every rank gets its weights, so the nodes need no shared disk; if it cannot, every rank
    raises the same error and the job ends with exit 2 everywhere."""
    def load(module):
        require(os.path.exists(path), f"--pretrain_model_path {path} not found; pass the checkpoint.pth that a "
                                      "pre-training run wrote under its --checkpoints folder")
        try:
            load_weights(module, path, map_location=device, formats=export_formats(), opener=open_release)
        except UserError as exc:
            raise UserError(f"cannot fine-tune from --pretrain_model_path: {exc}") from None

    ddp.load_on_main(model, load)
    logger.info(f"fine-tuning from {path}")


# ------------------------------------------------------------ released models see the series as given
def series_as_given(model, args):
    """Whether `model` (a class or an instance) forecasts the series as the data file holds it: its
    `series_as_given`, True or a function of the run's arguments (one release's reads --use_norm), default False."""
    declared = getattr(model, "series_as_given", False)
    return bool(declared(args) if callable(declared) else declared)


def check_series_as_given(args, cls):
    """One line, before anything is built, where released weights (--pretrain_model_path) of a model that
    forecasts the series as given cannot see it: data scaled series by series (--data univariate, a corpus)
    carries no one scaler to undo per window. (Trained from scratch, such a model sees what it trains on.)"""
    if not series_as_given(cls, args) or not args.scale or not args.pretrain_model_path:
        return
    data = prepared_data(args)
    require(data.scaler is not None or not data.per_series_scaling or args.data == "m4",  # M4 is never scaled
            f"--model {args.model} forecasts each series as given (its release's own scaling rules), "
            f"but --data {args.data} "
            "z-scores every series with its own training part, which cannot be undone window by window: add "
            "--scale false (its metrics are then on each series' own scale)")


def forecast_series_as_given(model, args, device):
    """For a model that forecasts the series as given (`series_as_given`) on data that --scale standardised
    with one scaler: hooks that hand its forward the window unscaled (x * std + mean, per channel; also a
    training `target=`) and standardise its forecast back, so that what is scored, trained on and written is
    on the run's scale, as every other model's, while the model computes its package's forecast of the series
    itself. Without them a release would forecast z-scores: TimesFM 2.5's non-negativity rule (a non-negative
    context gets a non-negative forecast) would never act, and scalings with an epsilon (Moirai 2.0's) or a
    rule for constant series would see other numbers than the user's. Returns the hooks' handles, or None."""
    if not series_as_given(model, args):
        return None
    scaler = prepared_data(args).scaler
    if scaler is None:  # --scale false: the series as given already (per-series scaling is refused above)
        return None
    mean = torch.as_tensor(scaler.mean_, dtype=torch.float64, device=device)
    std = torch.as_tensor(scaler.scale_, dtype=torch.float64, device=device)
    # A float32 z-score z of the value v holds v to within 2^-24 |v - mean|: a 0 of the file comes back as about
    # 1e-7 |mean|, of either sign, and a rule that asks whether every value is >= 0 (TimesFM 2.5's) would see
    # a negative. Values the z-scores cannot tell from 0 (within twice that bound) are 0 again.
    zero = std.new_tensor(2.0 ** -23) * mean.abs()

    def unscaled_values(z):
        v = z.double() * std + mean
        return torch.where(v.abs() <= zero, 0.0, v).to(z.dtype)

    def unscaled(module, inputs, kwargs):
        if inputs:
            inputs = (unscaled_values(inputs[0]), *inputs[1:])
        else:
            kwargs = dict(kwargs, x_enc=unscaled_values(kwargs["x_enc"]))
        if kwargs.get("target") is not None:
            kwargs = dict(kwargs, target=unscaled_values(kwargs["target"]))
        return inputs, kwargs

    def scaled_back(module, inputs, kwargs, output):
        if kwargs.get("target") is not None:  # a computes_loss model's per-window losses
            return output
        per_channel = (mean[:, None], std[:, None]) if output.dim() == 4 else (mean, std)  # [B, P, C(, levels)]
        return ((output.double() - per_channel[0]) / per_channel[1]).to(output.dtype)

    return (model.register_forward_pre_hook(unscaled, with_kwargs=True),
            model.register_forward_hook(scaled_back, with_kwargs=True))
