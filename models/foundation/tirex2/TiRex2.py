"""TiRex-2: NX-AI's zero-shot forecaster (82.5M parameters: 38.4M read by a univariate series, 44.1M more by the
multivariate mode), 12 blocks, each a bidirectional xLSTM over patches of 32 steps (mLSTM and sLSTM blocks
alternating; the reverse pass reads known covariates only) followed by attention across the variates of a group.
It forecasts the quantiles 0.1 ... 0.9 of all future_len steps in ONE pass: the horizon is NaN patches after the
context, predicted directly, never rolled out. The TiRex-2 paper (multivariate data and streaming):
arXiv 2607.01204; weights NX-AI/TiRex-2 (README.md here).

Builds on the tirex-2 package (an optional extra: pip install -e '.[tirex2]'): the network is the package's own
tirex2.TiRex2 (scaler, tokenizer, residual patch embeddings, mLSTM / sLSTM cells, variate attention, output head)
and its forward is called as it is; what is ours is the predict path around it, the package's TiRex2.predict step
for step (tests/test_tirex2.py and crosscheck.py hold it there), vectorised over the batch:
- each channel of each window is a series of its own, a group of one (the package's variate attention then skips
  it: a no-op; the reverse pass reads covariates only, so it does not run either);
- with tta_diff (the release's config), a series the package's PostProcessor finds trending (an OLS fit on its
  z-scored values; here the same fit in torch float64, `trends`) is forecast as its first difference and
  integrated back;
- the series is NaN-padded by pred_len, then to future_len, then in front to context_len + future_len, z-scored
  (arcsinh), and run through ONE forward; the future_len steps after the context are the forecast, cut to pred_len;
- the PostProcessor's band calibration (raw rows: median + sqrt(0.90) t^0.02 (q - median); differenced rows:
  cumsum of the median + sqrt(1.68) sign sqrt(cumsum offset^2) t^0.01 + the last value), one tensor expression
  for the batch where the package loops over groups;
- with tta_sign_flip (the release's config), the forecast of -x, its levels mirrored, averaged with that of x.
Nothing is read back to the host (tests/test_host_syncs.py): where the package asks the host (its scaler's
`is_binary.any()`, each block's covariate split and group count), the univariate path gives the same values by
torch.where, or by the instance attributes `build` sets on the package's modules (all rows forward, the variate
attention of groups of one its input).

The package decorates its ResidualBlock (the patch embeddings) with torch.compile at class level, so every call of
the package's model compiles them with TorchInductor (a C++ build per input shape on a CPU). Ours are the same
modules run eagerly (EagerResidualBlock: the class's __call__ restored to nn.Module's); crosscheck.py measures the
difference to the compiled path. The recurrent kernels are the package's CPU ones (mlstm_kernels' native chunkwise
mLSTM, flashrnn's vanilla sLSTM), wherever the model runs.

The release's multivariate mode (a series' columns one group, with past and known covariates) is covariates.py's,
for the fev-bench harness (`--covariates`): the package's predict on a model built here without the univariate
shortcuts.

Fine-tuning: the pinball loss over the nine quantiles after the post-processor (what is forecast and scored); every
step of it is per series, so a window's loss does not depend on the batch it is in. Dropout is built at 0 (the
release's dropout is a pre-training setting; --dropout is not read), so training is world-size exact without keyed
masks. [B, seq_len, C] -> B*C series -> [B, pred_len, C, 9].

Shapes: with --pretrain_model_path DIR, DIR's config.json (its sizes, context_len, future_len, recipe, scaler, TTA
flags); without it, the presumed released architecture (adapter.presumed_config) with --d_model (embedding_dim),
--n_heads, --e_layers (blocks, bi-mLSTM / bi-sLSTM alternating) and --d_ff (input_ff_dim). A --seq_len past
context_len (the package would silently drop the oldest steps) or a --pred_len past future_len (the package would
return fewer steps, with a warning) is refused."""
import copy
import types

import torch
from torch import nn

from models.foundation.tirex2 import adapter as release
from utils.errors import UserError
from utils.optional import require_package

package = require_package("tirex2.model.tirex2", "tirex-2", "tirex2", "TiRex2")
residual_block = require_package("tirex2.model.component.residual_block", "tirex-2", "tirex2", "TiRex2")
scaler_module = require_package("tirex2.model.component.scaler", "tirex-2", "tirex2", "TiRex2")


# Batch invariance (zero-shot forecasts the same at any batch size and number of processes), on a CPU: MKL's GEMM
# sums a row in another order when a product has few rows that are no multiple of 4, and ATen's elementwise loops
# compute the last elements of a range (under 2 AVX-512 vectors, 32 floats) by a scalar formula that rounds
# otherwise, so which elements are left over would depend on the batch. With the series padded to a multiple of 8
# rows, every product has a multiple of 8 rows and every activation (widths multiples of 4) a multiple of 32
# elements: measured, a series forecasts the same bits alone and in any batch. Not in training, where the rows
# are the windows'.
ROW_MULTIPLE = 8


class EagerResidualBlock(residual_block.ResidualBlock):
    """The package's ResidualBlock, called as any nn.Module is: its class-level torch.compile wraps the class's
    __call__ and _call_impl, which this subclass restores to nn.Module's own (hooks, LoRA and FSDP2 see a plain
    module; the forward is the package's)."""
    __call__ = nn.Module.__call__
    _call_impl = nn.Module._call_impl


def without_dropout(config):
    """`config` with every dropout at 0 (the model's and each block template's)."""
    config = copy.deepcopy(config)
    config["dropout"] = 0.0
    for template in config["stack_config"]["templates"].values():
        template["dropout"] = 0.0
    return config


def build(config, univariate=True):
    """The package's TiRex2 built from a release's config.json on the CPU kernels, without dropout, its patch
    embeddings eager; `univariate`: its blocks on the univariate path (every series a group of one, no covariates),
    which reads nothing back to the host (covariates.py builds it without)."""
    kwargs = without_dropout({k: v for k, v in config.items() if k not in ("device", "matmul_precision")})
    if torch.empty(()).device.type != "meta":
        model = package.TiRex2(**kwargs, device="cpu")  # matmul_precision would set torch's global precision: not read
    else:  # built on the meta device (benchmarks/memory_table.py): the package's closing .to("cpu") cannot copy
        moves = package.TiRex2.to
        package.TiRex2.to = lambda self, *args, **kw: self
        try:
            model = package.TiRex2(**kwargs, device="cpu")
        finally:
            package.TiRex2.to = moves
    for module in model.modules():
        if type(module) is residual_block.ResidualBlock:
            module.__class__ = EagerResidualBlock
    model.scaler = Scaler(**vars(model.scaler))
    for block in model.stack if univariate else ():  # groups of one, no covariates: no host sync
        block.time_mixer._split = _forward_only
        block.time_mixer._recombine = _forward_output
        block.variate_mixer.forward = _alone
    return model


class Scaler(scaler_module.Scaler):
    """The package's Scaler with the binary-aware choice made per series by torch.where, never by a host-side
    `if is_binary.any()` (a sync): the same values, arcsinh where a series is not binary."""

    def scale(self, x):
        loc = torch.nan_to_num(torch.nanmean(x, dim=-1, keepdim=True), nan=0.0)
        scale = torch.nan_to_num(torch.nanmean((x - loc) ** 2, dim=-1, keepdim=True).sqrt(), nan=1.0)
        scale = torch.clamp_min(scale, min=self.eps)
        scaled_x = (x - loc) / scale
        is_binary = None
        if self.binaryaware:
            valid = ~torch.isnan(x)
            is_binary = ((x == 0.0) | (x == 1.0) | ~valid).all(dim=-1, keepdim=True)
            loc = torch.where(is_binary, torch.zeros_like(loc), loc)
            scale = torch.where(is_binary, torch.ones_like(scale), scale)
            scaled_x = (x - loc) / scale
        if self.use_arcsinh:
            scaled_x = torch.arcsinh(scaled_x) if is_binary is None else torch.where(is_binary, scaled_x,
                                                                                      torch.arcsinh(scaled_x))
        return scaled_x, (loc, scale, is_binary)

    def re_scale(self, x, loc_scale):
        loc, scale, is_binary = loc_scale
        if self.use_arcsinh:
            sinh_x = torch.sinh(torch.clamp(x, -20.0, 20.0))
            x = sinh_x if is_binary is None else torch.where(is_binary[:, None], x, sinh_x)
        return x * scale[:, None] + loc[:, None]


def _forward_only(x, target_mask, known_covariate_mask=None):
    """BiXLSTM's split when every row is a target: all forward, none reversed (the package finds that by a
    torch.where over the masks, a host sync)."""
    return x, x[:0], None, None


def _forward_output(x_fwd, x_rev, fwd_idc, rev_idc, ref):
    """BiXLSTM's recombination when no row was reversed: the forward output (the package writes the covariates'
    combined rows into it; there are none)."""
    return x_fwd.to(ref.dtype)


def _alone(x, *args, **kwargs):
    """The variate attention over groups of one: the package returns its input unchanged (after torch.unique over
    the group ids, a host sync)."""
    return x


def trends(series, cfg):
    """PostProcessor._detect_trends for rows [N, L], in torch (float64, no host sync): |slope| * L >= threshold and
    R^2 >= trend_min_r2 of the least-squares line through the row's z-scored values (at least 4 of them, std at
    least 1e-12); the package fits each row with numpy.polyfit, the same line up to float64 rounding."""
    rows = series.detach().double()
    window = max(1, round(cfg.trend_window * rows.shape[-1]))
    rows = rows[:, -window:]
    valid = ~torch.isnan(rows)
    weight = valid.double()
    count = weight.sum(-1, keepdim=True)
    values = torch.where(valid, rows, 0.0)
    mean = values.sum(-1, keepdim=True) / count
    std = ((torch.where(valid, rows - mean, 0.0) ** 2).sum(-1, keepdim=True) / (count - 1)).sqrt()
    z = torch.where(valid, (rows - mean) / std, 0.0)
    steps = torch.arange(rows.shape[-1], dtype=torch.float64, device=rows.device).expand_as(rows)
    step_mean = (steps * weight).sum(-1, keepdim=True) / count
    z_mean = z.sum(-1, keepdim=True) / count
    centred = (steps - step_mean) * weight
    slope = (centred * (z - z_mean)).sum(-1, keepdim=True) / (centred ** 2).sum(-1, keepdim=True)
    residual = torch.where(valid, z - (slope * steps + z_mean - slope * step_mean), 0.0)
    total = (torch.where(valid, z - z_mean, 0.0) ** 2).sum(-1)
    r2 = torch.where(total > 1e-12, 1.0 - (residual ** 2).sum(-1) / total, 0.0)
    score = slope.squeeze(-1).abs() * rows.shape[-1]
    return ((count.squeeze(-1) >= 4) & (std.squeeze(-1) >= 1e-12) & (score >= cfg.trend_threshold)
            & (r2 >= cfg.trend_min_r2))


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    quantile_levels = release.LEVELS
    checkpoint_adapters = (release.TIREX2,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        path = getattr(configs, "pretrain_model_path", None)
        if path and not str(path).endswith((".pth", ".pt")):
            config = release.read_release(path)
        else:
            config = release.presumed_config(width=configs.d_model, heads=configs.n_heads, blocks=configs.e_layers,
                                             input_ff_dim=configs.d_ff)
        if config["embedding_dim"] % 4 or any(
                config["embedding_dim"] % t["time_mixer"].get("num_heads", 4)
                or config["embedding_dim"] % t["variate_mixer"].get("num_heads", 4)
                for t in config["stack_config"]["templates"].values()):
            raise UserError(f"TiRex-2's width {config['embedding_dim']} must divide into its heads (--d_model, "
                            "--n_heads)")
        context, future = int(config["context_len"]), int(config["future_len"])
        if configs.seq_len > context:
            raise UserError(f"TiRex-2 reads at most {context} steps of context (its context_len); --seq_len "
                            f"{configs.seq_len} would lose the oldest {configs.seq_len - context} unread (the package "
                            f"cuts them silently): use --seq_len {context} or less")
        if configs.pred_len > future:
            raise UserError(f"TiRex-2 forecasts at most {future} steps (its future_len) in its one pass, with no "
                            f"roll-out; --pred_len {configs.pred_len} is longer (the package would return {future} "
                            f"steps, with a warning): use --pred_len {future} or less")
        self.pred_len = configs.pred_len
        self.tirex2 = build(config)
        self.tta_diff = bool(config.get("tta_diff", True))
        self.tta_sign_flip = bool(config.get("tta_sign_flip", False))
        self.register_buffer(release.CONFIG_KEY, release.config_bytes(config))  # written back by an export
        for module in self.tirex2.modules():
            bias = getattr(module, "_bias_", None)
            if isinstance(bias, nn.Parameter) and bias.dim() == 3:  # an sLSTM cell's [heads, gates i f z o, head_dim]
                # read at every forward, so it holds for whatever tensor the cell has then (FSDP2's gathered one)
                module.get_bias = types.MethodType(_without_input_gate, module)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Weights of another configuration (another context_len, recipe or scaler) are refused in one line."""
        theirs, ours = state_dict.get(prefix + release.CONFIG_KEY), getattr(self, release.CONFIG_KEY)
        if theirs is not None and not torch.equal(theirs.to(ours), ours):
            mine, other = release.config_of(ours), release.config_of(theirs)
            differ = sorted(k for k in set(mine) | set(other) if mine.get(k) != other.get(k))
            raise UserError(f"these TiRex2 weights come from another configuration ({', '.join(differ[:5])} differ): "
                            "build the model from the release they came from (--pretrain_model_path)")
        # every alias name loads the one tensor its group's first name holds, as FSDP2 placed it (it knows that name
        # only), and is filled in where absent (torch's sharded load gives each tensor under one name)
        weights = prefix + release.PREFIX
        for key in [k for k in state_dict if k.startswith(weights)]:
            group = [weights + n for n in release.alias_group(key[len(weights):])]
            first = next(name for name in group if name in state_dict)
            for name in group:
                state_dict[name] = state_dict[first]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, length, channels = x_enc.shape
        dtype = self.tirex2.output_patch_embedding.output_layer.weight.dtype
        series = x_enc.permute(0, 2, 1).reshape(batch * channels, length).to(dtype)
        quantiles = self.forecast(series)  # [B*C, Q, pred_len]
        quantiles = quantiles.reshape(batch, channels, -1, self.pred_len).permute(0, 3, 1, 2)
        return quantiles.to(x_enc.dtype)  # [B, pred_len, C, Q]

    def forecast(self, series):
        """TiRex2.predict on univariate series [N, L] (each its own group): [N, Q, pred_len]. Without a gradient
        the series are padded to a multiple of ROW_MULTIPLE rows (copies of the last), which makes a series'
        forecast the same in any batch on a CPU (see ROW_MULTIPLE)."""
        count = series.shape[0]
        if not torch.is_grad_enabled() and count % ROW_MULTIPLE:
            extra = series[-1:].expand(ROW_MULTIPLE - count % ROW_MULTIPLE, -1)
            return self.forecast(torch.cat([series, extra]))[:count]
        out = self.one_pass(series)
        if not self.tta_sign_flip:
            return out
        mirrored = self.one_pass(-series).flip(1)  # the q-quantile of -x is the (1-q)-quantile of x (levels symmetric)
        return (out + -mirrored) / 2

    def one_pass(self, series):
        """TiRex2._predict: trend differencing, padding, one forward, the post-processor's calibration."""
        model, post = self.tirex2, self.tirex2.postprocessor
        count = series.shape[0]
        if self.tta_diff:
            trending = trends(series, post.cfg)
        else:
            trending = torch.zeros(count, dtype=torch.bool, device=series.device)
        rows = torch.where(trending[:, None], post._diff_forward(series)[0], series)
        last = post._diff_params(series)["last_values"]
        x = nn.functional.pad(rows, (0, self.pred_len), value=torch.nan)
        x = model._fix_context_size(self.pred_len, x, True)
        groups = torch.arange(1, count + 1, device=series.device, dtype=torch.float32)  # a group of one per series
        batch = {"x": x, "group_vector": groups, "target_mask": torch.ones(count, dtype=torch.bool, device=x.device)}
        pred = model(batch)  # [N, Q, context_len + future_len]
        pred = pred[..., :-model.output_patch_size][..., -model.future_len:][..., :self.pred_len]
        return calibrated(post.cfg, pred, trending, last, exact_sqrt=not torch.is_grad_enabled())


def _without_input_gate(cell):
    """An sLSTM cell's bias [heads, gates, head_dim] as its get_bias returns it, the same values, with the input
    gate's entries detached, so that their gradient is its exact value, 0: a constant shift of the exponential
    input gate moves the stabilizer m by the same amount (at the first step m is the input gate itself), so the
    gates, the cell and the normaliser are unchanged and the loss does not depend on that bias; its computed
    gradient is rounding noise, which Adam scales to learning-rate-sized steps that differ between world sizes."""
    bias = cell._bias_
    return torch.cat((bias[:, :1].detach(), bias[:, 1:]), dim=1)


def calibrated(cfg, pred, trending, last, exact_sqrt=True):
    """PostProcessor.transform_output on a batch of univariate groups: `pred` [N, Q, H], `trending` [N] (rows
    forecast as differences), `last` [N] (each series' last observed value). The same expressions in the same
    order as the package's, one tensor for the batch."""
    middle = pred.shape[1] // 2
    median = pred[:, middle:middle + 1, :]
    offset = pred - median
    steps = torch.arange(1, pred.shape[-1] + 1, device=pred.device, dtype=pred.dtype)
    raw = median + (cfg.raw_band_scale ** 0.5) * (steps ** (cfg.raw_band_exponent - 0.5)) * offset
    path = torch.cumsum(median, dim=-1)
    sign = offset.sum(dim=-1, keepdim=True).sign()
    squares = torch.cumsum(offset * offset, dim=-1)
    if exact_sqrt:
        rss = torch.sqrt(squares)
    else:  # as the package's preserve_grad: no sqrt'(0) at the median's own offset, the same values
        rss = torch.sqrt(squares.clamp_min(torch.finfo(squares.dtype).tiny))
        rss = torch.where(squares > 0, rss, torch.zeros_like(rss))
    band = sign * rss * (steps ** (cfg.diff_band_exponent - 0.5))
    integrated = path + (cfg.diff_band_scale ** 0.5) * band + last.to(pred.dtype)[:, None, None]
    return torch.where(trending[:, None, None], integrated, raw)
