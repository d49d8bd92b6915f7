"""The forward passes of training, validation and test, and which outputs they score.

Direct models (TSLib) forecast the horizon in one pass. Token models (OpenLTM) predict the
next output_token_len steps of every input token while training and validating, and roll
out test_pred_len steps at test time. Each function returns (prediction, truth) of the
elements that are scored.
"""
import math

import torch

from utils.distributed import AgreedError


def forward(model, batch, args, stage, device):
    """(prediction, truth) for the elements that are scored at `stage` (train, val or test)."""
    if not args.autoregressive:
        return direct_forward(model, batch, args, device)
    if stage == "test":
        return rollout(model, batch, args, device)
    return token_forward(model, batch, args, stage, device)


def direct_forward(model, batch, args, device):
    x, y, x_mark, y_mark = on_device(batch, device)
    pred_len, label_len = args.pred_len, args.label_len
    dec_inp = None
    if "x_dec" in args.model_inputs:  # TSLib decoder input: the last label_len known steps, then zeros
        dec_inp = torch.cat([y[:, :label_len], torch.zeros_like(y[:, -pred_len:])], dim=1)
    out = forecast_of(model(x, _used("x_mark_enc", x_mark, args), dec_inp, _used("x_mark_dec", y_mark, args)), args)
    if out.shape[1] != pred_len:  # even a no-op slice costs a zero-fill and copy in backward
        out = out[:, -pred_len:]
    return target_channels(out, args), target_channels(y[:, -pred_len:], args)


def token_forward(model, batch, args, stage, device):
    """Every input token predicts the next output_token_len steps; score them all,
    or only the last token with --last_token (always) / --valid_last (validation)."""
    x, y, x_mark, _ = on_device(batch, device)
    token, out_len = args.input_token_len, args.output_token_len
    out = forecast_of(model(x, _used("x_mark_enc", x_mark, args), None, None), args)
    batch_size, n_tokens = x.shape[0], x.shape[1] // token
    pred = out.reshape(batch_size, n_tokens, out_len, -1)
    true = y.unfold(1, out_len, token).permute(0, 1, 3, 2)  # [B, N, out_len, C]
    if args.last_token or (stage == "val" and args.valid_last):
        pred, true = pred[:, -1:], true[:, -1:]
    return target_channels(pred, args), target_channels(true, args)


def rollout(model, batch, args, device):
    """Autoregressive test: feed predictions back until test_pred_len steps exist."""
    x, y, x_mark, y_mark = on_device(batch, device)
    out_len, horizon, history = args.output_token_len, args.test_pred_len, x.shape[1]
    steps = math.ceil(horizon / out_len)
    # step s reads the marks of its input rows, s * out_len onwards: the last step's input ends at
    # (steps - 1) * out_len + history < history + horizon, within the window's own marks
    marks = torch.cat([x_mark, y_mark], dim=1) if "x_mark_enc" in args.model_inputs else None
    preds = []
    for step in range(steps):
        window_marks = None if marks is None else marks[:, step * out_len: step * out_len + history]
        nxt = forecast_of(model(x, window_marks, None, None), args)[:, -out_len:]
        preds.append(nxt)
        x = torch.cat([x[:, out_len:], nxt], dim=1)
    pred = torch.cat(preds, dim=1)[:, :horizon]
    return target_channels(pred, args), target_channels(y, args)


def forecast_of(out, args):
    """The model's output, or one line when its forward returned None: TSLib's models branch on
    configs.task_name and return nothing for a task they lack. Every rank runs the same model code on the
    same task, so every rank raises this at the same call: an agreed error (rank 0 prints, all leave together)."""
    if out is None:
        raise AgreedError(f"model {args.model} returned None for --task_name {args.task_name}: its forward has no "
                          "branch for this task; give a task it forecasts (TSLib's models: --task_name "
                          "long_term_forecast), or have its forward return the forecast")
    return out


def target_channels(tensor, args):
    """MS and --covariate score only the target, which the data puts last."""
    if args.features == "MS" or args.covariate:
        return tensor[..., -1:]
    return tensor


def on_device(batch, device):
    if batch[0].device == device:  # splits kept on the GPU, or CPU training
        return batch
    return tuple(None if t is None else t.to(device, non_blocking=True) for t in batch)


def _used(name, tensor, args):
    """`tensor` if the model reads forward argument `name`, else None (see models.inputs_used)."""
    return tensor if name in args.model_inputs else None
