"""TimeMixer: an all-MLP forecaster over several time scales. The lookback window is down-sampled into
coarser copies; each scale is normalised and embedded, then Past-Decomposable-Mixing blocks split every
scale into seasonal and trend parts and mix seasons bottom-up (fine -> coarse) and trends top-down
(coarse -> fine); Future-Multipredictor-Mixing lets every scale forecast the horizon with its own linear
map and sums the forecasts. Wang et al., "TimeMixer: Decomposable Multiscale Mixing for Time Series
Forecasting", ICLR 2024; follows the official code as ported to TSLib."""
import torch
from torch import nn

from layers.decomposition import SeriesDecomposition
from layers.embed import DataEmbedding
from layers.normalization import InstanceNorm


def scale_lengths(configs) -> list[int]:
    """Length of the series at every scale, finest first, as the configured down-sampling produces it."""
    lengths = [configs.seq_len]
    method = getattr(configs, "down_sampling_method", None)
    if not method:
        return lengths  # no down-sampling: a single scale, as the official code behaves
    window = getattr(configs, "down_sampling_window", 1)
    for _ in range(getattr(configs, "down_sampling_layers", 0)):
        if method == "conv":  # kernel 3, padding 1, stride window
            lengths.append((lengths[-1] - 1) // window + 1)
        else:  # pooling drops an incomplete last window
            lengths.append(lengths[-1] // window)
    if lengths[-1] < 1:
        raise ValueError(f"seq_len {configs.seq_len} is too short for {len(lengths) - 1} "
                         f"down-sampling layers of window {window}")
    return lengths


def _time_mlp(length_in: int, length_out: int) -> nn.Sequential:
    """Two-layer MLP along time, used to carry one scale's pattern to a neighbouring scale."""
    return nn.Sequential(nn.Linear(length_in, length_out), nn.GELU(), nn.Linear(length_out, length_out))


def _feature_mlp(d_model: int, d_ff: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))


class DFTDecomposition(nn.Module):
    """Seasonal part = the top_k strongest non-zero frequencies of each series over time; trend = the rest.

    The official code transforms the last axis (the model width, not time), zeroes the first batch
    element instead of the zero frequency and keeps a hard-coded 5 frequencies; this applies the
    method as the paper describes it.
    """

    def __init__(self, top_k: int):
        super().__init__()
        self.top_k = top_k

    def forward(self, x: torch.Tensor):  # x [B, T, D]
        length = x.shape[1]
        spectrum = torch.fft.rfft(x.float(), dim=1)
        amplitude = spectrum.abs().detach()
        amplitude[:, 0] = 0  # the mean is trend, never season
        k = min(self.top_k, amplitude.shape[1] - 1)
        keep = torch.zeros_like(amplitude, dtype=torch.bool)
        keep.scatter_(1, amplitude.topk(k, dim=1).indices, True)
        season = torch.fft.irfft(spectrum * keep, n=length, dim=1).to(x.dtype)
        return season, x - season


class MultiScaleSeasonMixing(nn.Module):
    """Bottom-up: each coarser season receives an MLP projection of the (already mixed) finer one."""

    def __init__(self, lengths: list[int]):
        super().__init__()
        self.down_sampling_layers = nn.ModuleList(
            _time_mlp(lengths[i], lengths[i + 1]) for i in range(len(lengths) - 1))

    def forward(self, seasons: list[torch.Tensor]) -> list[torch.Tensor]:  # each [B', D, T_i]
        mixed = [seasons[0]]
        for coarser, layer in zip(seasons[1:], self.down_sampling_layers):
            mixed.append(coarser + layer(mixed[-1]))
        return mixed


class MultiScaleTrendMixing(nn.Module):
    """Top-down: each finer trend receives an MLP projection of the (already mixed) coarser one."""

    def __init__(self, lengths: list[int]):
        super().__init__()
        # coarsest pair first, the order in which forward uses them (and TSLib's parameter order)
        self.up_sampling_layers = nn.ModuleList(
            _time_mlp(lengths[i + 1], lengths[i]) for i in reversed(range(len(lengths) - 1)))

    def forward(self, trends: list[torch.Tensor]) -> list[torch.Tensor]:  # each [B', D, T_i]
        mixed = [trends[-1]]
        for finer, layer in zip(reversed(trends[:-1]), self.up_sampling_layers):
            mixed.append(finer + layer(mixed[-1]))
        return mixed[::-1]


class PastDecomposableMixing(nn.Module):
    """One PDM block over the list of scales, each [B', T_i, d_model].

    Channel independent: out = x + FFN(mixed season + mixed trend), as the official code.
    Channel mixing: season and trend first pass a shared feature MLP and the output is the
    mixed sum without residual, again as the official code (its unused residual FFN and
    LayerNorm are left out so that every parameter is trained).
    """

    def __init__(self, configs, lengths: list[int]):
        super().__init__()
        self.channel_independence = getattr(configs, "channel_independence", 1) == 1
        method = getattr(configs, "decomp_method", "moving_avg")
        if method == "moving_avg":
            # one module per scale: each keeps its own averaging matrix for its length
            self.decompositions = nn.ModuleList(SeriesDecomposition(getattr(configs, "moving_avg", 25), length)
                                                for length in lengths)
        elif method == "dft_decomp":
            self.decompositions = nn.ModuleList(DFTDecomposition(getattr(configs, "top_k", 5)) for _ in lengths)
        else:
            raise ValueError(f"decomp_method must be 'moving_avg' or 'dft_decomp', got {method!r}")
        if self.channel_independence:
            self.out_cross_layer = _feature_mlp(configs.d_model, configs.d_ff)
        else:
            self.cross_layer = _feature_mlp(configs.d_model, configs.d_ff)
        self.mixing_multi_scale_season = MultiScaleSeasonMixing(lengths)
        self.mixing_multi_scale_trend = MultiScaleTrendMixing(lengths)

    def forward(self, scales: list[torch.Tensor]) -> list[torch.Tensor]:
        seasons, trends = [], []
        for x, decomposition in zip(scales, self.decompositions):
            season, trend = decomposition(x)
            if not self.channel_independence:
                season, trend = self.cross_layer(season), self.cross_layer(trend)
            seasons.append(season.transpose(1, 2))  # mixing runs along time, the last axis
            trends.append(trend.transpose(1, 2))
        seasons = self.mixing_multi_scale_season(seasons)
        trends = self.mixing_multi_scale_trend(trends)
        out = []
        for x, season, trend in zip(scales, seasons, trends):
            mixed = (season + trend).transpose(1, 2)
            out.append(x + self.out_cross_layer(mixed) if self.channel_independence else mixed)
        return out


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc")

    def __init__(self, configs):
        super().__init__()
        self.pred_len = configs.pred_len
        self.channel_independence = getattr(configs, "channel_independence", 1) == 1
        self.down_sampling_method = getattr(configs, "down_sampling_method", None)
        if self.down_sampling_method not in (None, "avg", "max", "conv"):
            raise ValueError(f"down_sampling_method must be avg, max, conv or None, got {self.down_sampling_method!r}")
        self.down_sampling_window = getattr(configs, "down_sampling_window", 1)
        self.mark_pairing = getattr(configs, "mark_pairing", "window")
        if self.mark_pairing not in ("window", "tiled"):
            raise ValueError(f"mark_pairing must be window or tiled, got {self.mark_pairing!r}")
        self.lengths = scale_lengths(configs)
        n_scales = len(self.lengths)
        mark_dim = getattr(configs, "mark_dim", 0)

        if self.down_sampling_method == "conv":
            # Registered once and trained: the official code builds a fresh random conv on every call.
            self.down_sampling_conv = nn.Conv1d(configs.enc_in, configs.enc_in, kernel_size=3, padding=1,
                                                stride=self.down_sampling_window, padding_mode="circular",
                                                bias=False)
        # RevIN per scale with a learned affine map, as the official Normalize(affine=True);
        # only the finest scale's statistics map the forecast back.
        self.normalize_layers = None
        if getattr(configs, "use_norm", 1):
            self.normalize_layers = nn.ModuleList(InstanceNorm(configs.enc_in, affine=True) for _ in range(n_scales))
        self.enc_embedding = DataEmbedding(1 if self.channel_independence else configs.enc_in, configs.d_model,
                                           mark_dim, getattr(configs, "dropout", 0.1), position=False)
        self.pdm_blocks = nn.ModuleList(PastDecomposableMixing(configs, self.lengths)
                                        for _ in range(configs.e_layers))

        # Future-Multipredictor-Mixing: every scale forecasts the whole horizon.
        self.predict_layers = nn.ModuleList(nn.Linear(length, configs.pred_len) for length in self.lengths)
        if self.channel_independence:
            self.projection_layer = nn.Linear(configs.d_model, 1)
        else:
            self.projection_layer = nn.Linear(configs.d_model, configs.c_out)
            # the inputs' moving-average trend bypasses the mixer and is regressed straight to the horizon
            self.preprocess = nn.ModuleList(SeriesDecomposition(getattr(configs, "moving_avg", 25), length)
                                            for length in self.lengths)
            self.out_res_layers = nn.ModuleList(nn.Linear(length, length) for length in self.lengths)
            self.regression_layers = nn.ModuleList(nn.Linear(length, configs.pred_len) for length in self.lengths)

    def _multi_scale_inputs(self, x: torch.Tensor, x_mark: torch.Tensor | None):
        """[B, T, C] (and marks) -> lists over scales, finest first."""
        xs, marks = [x], [x_mark]
        series = x.transpose(1, 2)  # pooling runs over the last axis
        for length in self.lengths[1:]:
            if self.down_sampling_method == "avg":
                series = nn.functional.avg_pool1d(series, self.down_sampling_window)
            elif self.down_sampling_method == "max":
                series = nn.functional.max_pool1d(series, self.down_sampling_window)
            else:
                series = self.down_sampling_conv(series)
            xs.append(series.transpose(1, 2))
            if x_mark is not None:  # the first step of every window, trimmed to the pooled length
                x_mark = x_mark[:, ::self.down_sampling_window]
            marks.append(None if x_mark is None else x_mark[:, :length])
        return xs, marks

    def _pair_marks(self, marks: torch.Tensor, channels: int) -> torch.Tensor:
        """[B, T, M] -> [B * C, T, M], the calendar of each channel-independent series b*C + c."""
        if self.mark_pairing == "tiled":
            # the official code's .repeat(C, 1, 1): window (b*C + c) mod B's calendar, so a forecast
            # depends on its batch-mates (see reproduce_summary.md); only to reproduce its figures
            return marks.repeat(channels, 1, 1)
        return marks.repeat_interleave(channels, dim=0)  # window b's own calendar

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, length, channels = x_enc.shape
        if length != self.lengths[0]:
            raise ValueError(f"TimeMixer expects seq_len={self.lengths[0]} input steps, got {length}")
        if x_mark_enc is not None and (x_mark_enc.shape[-1] == 0 or self.enc_embedding.temporal is None):
            x_mark_enc = None
        xs, marks = self._multi_scale_inputs(x_enc, x_mark_enc)
        if self.normalize_layers is not None:
            xs = [norm.norm(x) for norm, x in zip(self.normalize_layers, xs)]

        trends = None
        if self.channel_independence:
            # every channel becomes its own univariate sample: [B, T, C] -> [B * C, T, 1]
            xs = [x.transpose(1, 2).reshape(batch * channels, -1, 1) for x in xs]
            marks = [None if m is None else self._pair_marks(m, channels) for m in marks]
        else:
            parts = [decomposition(x) for decomposition, x in zip(self.preprocess, xs)]
            xs, trends = [season for season, _ in parts], [trend for _, trend in parts]

        scales = [self.enc_embedding(x, m) for x, m in zip(xs, marks)]
        for block in self.pdm_blocks:
            scales = block(scales)

        forecast = 0
        for i, (hidden, predict) in enumerate(zip(scales, self.predict_layers)):
            out = self.projection_layer(predict(hidden.transpose(1, 2)).transpose(1, 2))  # [B', P, 1 or c_out]
            if self.channel_independence:
                out = out.reshape(batch, channels, self.pred_len).transpose(1, 2)
            else:
                trend = self.regression_layers[i](self.out_res_layers[i](trends[i].transpose(1, 2)))
                out = out + trend.transpose(1, 2)
            forecast = forecast + out
        if self.normalize_layers is not None:
            forecast = self.normalize_layers[0].denorm(forecast)
        return forecast
