"""The forward passes of training, validation and test, and which outputs they score.

Direct models (TSLib) forecast the horizon in one pass. Token models (OpenLTM) predict the
next output_token_len steps of every input token while training and validating, and roll
out test_pred_len steps at test time. Each function returns (prediction, truth) of the
elements that are scored.

A probabilistic --loss widens the model's horizon `width` times (exp.settings.model_configs); its output is read
back as `width` blocks of the horizon, and the prediction holds them last: [..., C, width], the objective's
parameters of each scored element (utils.probabilistic). A rollout feeds back their median.
"""
import math

import numpy as np
import torch

from data_provider.data_factory import split_numbering
from layers import noise
from utils.distributed import AgreedError
from utils.probabilistic import window_keys


def forward(model, batch, args, stage, device):
    """(prediction, truth) for the elements that are scored at `stage` (train, val or test)."""
    if not args.autoregressive:
        return direct_forward(model, batch, args, device)
    if stage == "test":
        return rollout(model, batch, args, device)
    return token_forward(model, batch, args, stage, device)


def training_loss(model, batch, args, device, loss):
    """(this micro-batch's mean training loss, the elements it weighs, its windows): `loss(pred, truth)` over the
    scored elements; or, for a model with its own objective (`computes_loss`), the mean of the per-window losses
    it returns when given the window's future: model(x, None, None, None, target=[B, pred_len, C]) -> [B]."""
    if not getattr(args, "computes_loss", False):
        pred, true = forward(model, batch, args, "train", device)
        return loss(pred, true), true.numel(), pred.shape[0]
    x, y = on_device(batch, device)[:2]
    windows = model(x, None, None, None, target=y[:, -args.pred_len:])
    if windows.shape != (x.shape[0],):
        raise AgreedError(f"model {args.model} computes its own loss (computes_loss) and must return one loss per "
                          f"window, shape ({x.shape[0]},), when given target=; it returned {tuple(windows.shape)}")
    return windows.mean(), x.shape[0], x.shape[0]


def window_draws(seed, stage, dataset):
    """For each evaluation batch's window positions (host integers: the loader's batch_positions), the context in
    which a model's own random draws (layers.noise: a sampler's noise) follow each window's number in the split,
    not its rank or batch."""
    numbers = split_numbering(dataset)[0]

    def draws(positions):
        def keys():  # at the first draw only: nothing to compute for a model that draws nothing
            return window_keys(seed, f"{stage} draws", numbers[np.asarray(positions)])
        return noise.draws_follow_windows(keys)
    return draws


def widened(args):
    """Whether the model's output is `width` blocks of the horizon, read back as [..., C, width]: under every
    probabilistic --loss, one block (a single quantile level) included; not for a model that forecasts its
    quantiles natively (its forward returns them as a last dimension of their own)."""
    return args.objective is not None and not getattr(args, "native_quantiles", None)


def direct_forward(model, batch, args, device):
    x, y, x_mark, y_mark = on_device(batch, device)
    width = args.width
    dec_inp, dec_mark = decoder_inputs(y, y_mark, args, width)
    out = forecast_of(model(x, _used("x_mark_enc", x_mark, args), dec_inp, dec_mark), args)
    steps = args.pred_len * width
    if out.shape[1] != steps:  # even a no-op slice costs a zero-fill and copy in backward
        out = out[:, -steps:]
    if widened(args):
        out = blocks(out, width)
    levels = args.objective is not None  # [..., C, levels]: widened, or the model's own
    return target_channels(out, args, levels), target_channels(y[:, -args.pred_len:], args)


def decoder_inputs(y, y_mark, args, width=1):
    """(x_dec, x_mark_dec) of TSLib's decoder, each None if the model does not read it: the last label_len
    known steps, then zeros for the horizon, `width` horizons long (a probabilistic --loss); the horizon's
    time features repeat for each of them."""
    label_len, pred_len = args.label_len, args.pred_len
    dec_inp = dec_mark = None
    if "x_dec" in args.model_inputs:
        dec_inp = torch.cat([y[:, :label_len], y.new_zeros(y.shape[0], pred_len * width, y.shape[2])], dim=1)
    if "x_mark_dec" in args.model_inputs and y_mark is not None:
        dec_mark = y_mark if width == 1 else torch.cat([y_mark[:, :label_len], y_mark[:, -pred_len:].repeat(1, width, 1)], 1)
    return dec_inp, dec_mark


def blocks(out, width):
    """[B, width * T, C] -> [B, T, C, width]: block k of the widened horizon is parameter k of every step."""
    batch, steps, channels = out.shape
    return out.reshape(batch, width, steps // width, channels).permute(0, 2, 3, 1)


def token_forward(model, batch, args, stage, device):
    """Every input token predicts the next output_token_len steps; score them all,
    or only the last token with --last_token (always) / --valid_last (validation)."""
    x, y, x_mark, _ = on_device(batch, device)
    token, out_len, width = args.input_token_len, args.output_token_len, args.width
    out = forecast_of(model(x, _used("x_mark_enc", x_mark, args), None, None), args)
    batch_size, n_tokens = x.shape[0], x.shape[1] // token
    pred = out.reshape(batch_size, n_tokens, width * out_len, -1)
    if widened(args):  # each token's widened output: width blocks of out_len steps -> [B, N, out_len, C, width]
        pred = pred.reshape(batch_size, n_tokens, width, out_len, -1).permute(0, 1, 3, 4, 2)
    true = y.unfold(1, out_len, token).permute(0, 1, 3, 2)  # [B, N, out_len, C]
    if args.last_token or (stage == "val" and args.valid_last):
        pred, true = pred[:, -1:], true[:, -1:]
    return target_channels(pred, args, widened(args)), target_channels(true, args)


def rollout(model, batch, args, device):
    """Autoregressive test: feed predictions back until test_pred_len steps exist."""
    x, y, x_mark, y_mark = on_device(batch, device)
    out_len, horizon, history, width = args.output_token_len, args.test_pred_len, x.shape[1], args.width
    levels = widened(args)
    steps = math.ceil(horizon / out_len)
    # step s reads the marks of its input rows, s * out_len onwards: the last step's input ends at
    # (steps - 1) * out_len + history < history + horizon, within the window's own marks
    marks = torch.cat([x_mark, y_mark], dim=1) if "x_mark_enc" in args.model_inputs else None
    preds = []
    for step in range(steps):
        window_marks = None if marks is None else marks[:, step * out_len: step * out_len + history]
        nxt = forecast_of(model(x, window_marks, None, None), args)[:, -out_len * width:]
        nxt = blocks(nxt, width) if levels else nxt
        preds.append(nxt)
        x = torch.cat([x[:, out_len:], args.objective.point(nxt).to(x.dtype) if levels else nxt], dim=1)
    pred = torch.cat(preds, dim=1)[:, :horizon]
    return target_channels(pred, args, levels), target_channels(y, args)


def forecast_of(out, args):
    """The model's output, or one line when its forward returned None: TSLib's models branch on
    configs.task_name and return nothing for a task they lack. Every rank runs the same model code on the
    same task, so every rank raises this at the same call: an agreed error (rank 0 prints, all leave together)."""
    if out is None:
        raise AgreedError(f"model {args.model} returned None for --task_name {args.task_name}: its forward has no "
                          "branch for this task; give a task it forecasts (TSLib's models: --task_name "
                          "long_term_forecast), or have its forward return the forecast")
    return out


def target_channels(tensor, args, levels=False):
    """MS and --covariate score only the target, which the data puts last (channels are the last dimension,
    or, with `levels`, the one before a probabilistic prediction's parameters)."""
    if args.features == "MS" or args.covariate:
        return tensor[..., -1:, :] if levels else tensor[..., -1:]
    return tensor


def on_device(batch, device):
    if batch[0].device == device:  # splits kept on the GPU, or CPU training
        return batch
    return tuple(None if t is None else t.to(device, non_blocking=True) for t in batch)


def _used(name, tensor, args):
    """`tensor` if the model reads forward argument `name`, else None (see models.inputs_used)."""
    return tensor if name in args.model_inputs else None
