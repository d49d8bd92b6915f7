"""TimeMixer: an all-MLP forecaster over several time scales. The lookback window is down-sampled into
coarser copies; each scale is normalised and embedded, then Past-Decomposable-Mixing blocks split every
scale into seasonal and trend parts and mix seasons bottom-up (fine -> coarse) and trends top-down
(coarse -> fine); Future-Multipredictor-Mixing lets every scale forecast the horizon with its own linear
map and sums the forecasts. Wang et al., "TimeMixer: Decomposable Multiscale Mixing for Time Series
Forecasting", ICLR 2024; follows the official code as ported to TSLib.

Speed (the mathematics is the official code's, to float rounding): the hidden state is feature-major with
the scales side by side, so every time MLP is one product over the rows of a scale and every feature
MLP one product over all columns, and the moving-average decomposition folds into the mixing products
(177 -> 121 ms a step, benchmarks/results/speed_notes.md). The embedding's dropout keeps that measured faster path:
in place on the feature-major layout, its masks drawn by layers.dropout along the samples' dimension 1
(_dropout_).
(Computing the feature MLP's wide hidden layer a cache-sized block at a time, as TSMixer and TiDE do,
measured no faster here: 195 against 193 ms a step on 2 idle cores.)"""
import torch
from torch import nn

from layers.decomposition import SeriesDecomposition
from layers.dropout import dropout_noise, fused_dropout
from layers.embedding import StepTokenEmbedding
from layers.mlp import mlp_over_columns
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


def _over_features(mlp: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """A (Linear, activation, Linear) MLP over every column of the feature-major x [d_in, M] -> [d_out, M]:
    one matrix product per layer and no transposed copies (layers.mlp.mlp_over_columns)."""
    first, activation, second = mlp
    return mlp_over_columns(x, first, second, activation)


def _time_mlp_after(mlp: nn.Sequential, x: torch.Tensor, time_map: torch.Tensor) -> torch.Tensor:
    """mlp(x @ time_map^T) for x [rows, T], with the fixed [T, T] map folded into the first layer's weight."""
    first, activation, second = mlp
    return second(activation(nn.functional.linear(x, first.weight @ time_map, first.bias)))


def _dropout_(x: torch.Tensor, dropout: nn.Dropout, batch_dim: int = 0) -> torch.Tensor:
    """dropout(x) in place (x: a fresh product no other operation reads) with layers.dropout's mask, which
    follows the samples along `batch_dim` in training; a GPU or torch.compile outside that fuses F.dropout."""
    p = dropout.p
    if not dropout.training or p == 0:
        return x
    if fused_dropout(x):  # the device's or the compiler's fused kernel
        return dropout(x)
    return x.mul_(dropout_noise(x, p, batch_dim))  # layers.dropout's mask (following the samples in training)


class DFTDecomposition(nn.Module):
    """Seasonal part = the top_k strongest non-zero frequencies of each series over time; trend = the rest.

    The official code transforms the last axis (the model width, not time), zeroes the first batch
    element instead of the zero frequency and keeps a hard-coded 5 frequencies; this applies the
    method as the paper describes it.
    """

    def __init__(self, top_k: int):
        super().__init__()
        self.top_k = top_k

    def forward(self, x: torch.Tensor):  # x [..., T]: time on the last axis
        length = x.shape[-1]
        spectrum = torch.fft.rfft(x.float(), dim=-1)
        amplitude = spectrum.abs().detach()
        amplitude[..., 0] = 0  # the mean is trend, never season
        k = min(self.top_k, amplitude.shape[-1] - 1)
        keep = torch.zeros_like(amplitude, dtype=torch.bool)
        keep.scatter_(-1, amplitude.topk(k, dim=-1).indices, True)
        season = torch.fft.irfft(spectrum * keep, n=length, dim=-1).to(x.dtype)
        return season, x - season


class MultiScaleSeasonMixing(nn.Module):
    """Bottom-up: each coarser season receives an MLP projection of the (already mixed) finer one."""

    def __init__(self, lengths: list[int]):
        super().__init__()
        self.down_sampling_layers = nn.ModuleList(
            _time_mlp(lengths[i], lengths[i + 1]) for i in range(len(lengths) - 1))

    def forward(self, seasons: list[torch.Tensor]) -> list[torch.Tensor]:  # each [..., T_i]
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

    def forward(self, trends: list[torch.Tensor]) -> list[torch.Tensor]:  # each [..., T_i]
        mixed = [trends[-1]]
        for finer, layer in zip(reversed(trends[:-1]), self.up_sampling_layers):
            mixed.append(finer + layer(mixed[-1]))
        return mixed[::-1]


class PastDecomposableMixing(nn.Module):
    """One PDM block over all scales at once: x [d_model, N, sum of T_i], feature-major (N series), the
    scales side by side along time, finest first.

    Channel independent: out = x + FFN(mixed season + mixed trend), as the official code.
    Channel mixing: season and trend first pass a shared feature MLP and the output is the
    mixed sum without residual, again as the official code (its unused residual FFN and
    LayerNorm are left out so that every parameter is trained).
    """

    def __init__(self, configs, lengths: list[int]):
        super().__init__()
        self.lengths = lengths
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
        # a linear decomposition mixed without a feature MLP in between folds into the mixing
        self.folded = method == "moving_avg" and self.channel_independence
        if self.channel_independence:
            self.out_cross_layer = _feature_mlp(configs.d_model, configs.d_ff)
        else:
            self.cross_layer = _feature_mlp(configs.d_model, configs.d_ff)
        self.mixing_multi_scale_season = MultiScaleSeasonMixing(lengths)
        self.mixing_multi_scale_trend = MultiScaleTrendMixing(lengths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Time mixing runs along the rows of each scale's [d_model * N, T_i] (views of x with row stride
        # sum T_i, which the matrix products take as they are); the feature MLP along the columns of
        # [d_model, N * sum T_i], all scales in one product.
        rows = [scale.view(-1, scale.shape[-1]) for scale in x.split(self.lengths, dim=-1)]
        mixed = self._mix_folded(x, rows) if self.folded else self._mix(rows, len(x))
        if not self.channel_independence:
            return mixed.view(x.shape)
        width = len(x)
        return _over_features(self.out_cross_layer, mixed.view(width, -1)).add_(x.view(width, -1)).view(x.shape)

    def _mix(self, rows: list[torch.Tensor], width: int) -> torch.Tensor:
        """Decompose every scale, mix seasons bottom-up and trends top-down; their sums side by side."""
        seasons, trends = [], []
        for x, decomposition in zip(rows, self.decompositions):
            if isinstance(decomposition, SeriesDecomposition):
                trend = x @ decomposition.averaging_matrix.to(x.dtype).t()  # the moving average over time
                season = x - trend
            else:
                season, trend = decomposition(x)
            if not self.channel_independence:
                season = _over_features(self.cross_layer, season.reshape(width, -1)).view(x.shape)
                trend = _over_features(self.cross_layer, trend.reshape(width, -1)).view(x.shape)
            seasons.append(season)
            trends.append(trend)
        seasons = self.mixing_multi_scale_season(seasons)
        trends = self.mixing_multi_scale_trend(trends)
        return torch.cat([(season + trend).view(width, -1, season.shape[-1])
                          for season, trend in zip(seasons, trends)], dim=-1)

    def _mix_folded(self, x: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
        """_mix for the moving average without a feature MLP between decomposition and mixing.

        The moving average is a fixed matrix A over time, so scale i's season is one product
        x_i (I - A_i)^T and its trend x_i A_i^T; the product adds the term mixed into that scale
        (addmm's addend) instead of a separate pass. The finest season and the coarsest trend only
        feed an MLP, so their maps fold into its first layer. As season + trend = x, every scale's sum
        is x_i + (its bottom-up term) + (its top-down term): x plus one tensor of those terms.
        """
        n = len(rows)
        if n == 1:
            return x
        trend_maps = [d.averaging_matrix.to(x.dtype) for d in self.decompositions]  # A_i
        season_maps = [torch.eye(len(a), dtype=a.dtype, device=a.device) - a for a in trend_maps]  # I - A_i
        # bottom-up: s_0 = x_0 (I - A_0)^T, s_i = x_i (I - A_i)^T + down_i(s_{i-1})
        down_layers = self.mixing_multi_scale_season.down_sampling_layers
        downs = [None, _time_mlp_after(down_layers[0], rows[0], season_maps[0])]  # at i: scale i's term
        for i, layer in enumerate(down_layers[1:], 1):
            downs.append(layer(torch.addmm(downs[i], rows[i], season_maps[i].t())))
        # top-down: t_n = x_n A_n^T, t_i = x_i A_i^T + up_i(t_{i+1})
        up_layers = self.mixing_multi_scale_trend.up_sampling_layers
        ups = [None] * n
        ups[n - 2] = _time_mlp_after(up_layers[0], rows[-1], trend_maps[-1])
        for i, layer in zip(reversed(range(n - 2)), up_layers[1:]):
            ups[i] = layer(torch.addmm(ups[i + 1], rows[i + 1], trend_maps[i + 1].t()))
        terms = [ups[0], *(down + up for down, up in zip(downs[1:-1], ups[1:-1])), downs[-1]]
        return torch.cat([term.view(len(x), -1, term.shape[-1]) for term in terms], dim=-1).add_(x)


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
        self.enc_embedding = StepTokenEmbedding(1 if self.channel_independence else configs.enc_in, configs.d_model,
                                           mark_dim, getattr(configs, "dropout", 0.1), position=False)
        # The value embedding's width-3 circular convolution reads steps t-1, t, t+1 of each scale (modulo
        # its length): their indices into the scales laid side by side, [3 * sum T_i] (not in the state_dict).
        starts = [sum(self.lengths[:i]) for i in range(n_scales)]
        self.register_buffer("conv_taps", torch.cat([
            torch.cat([start + (torch.arange(length) + shift) % length for start, length in zip(starts, self.lengths)])
            for shift in (-1, 0, 1)]), persistent=False)
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

    def _embed(self, xs: list[torch.Tensor], marks: list[torch.Tensor | None]) -> torch.Tensor:
        """Every scale's [B, T_i, C] series (and marks) -> the embeddings, feature-major and side by
        side along time: [d_model, N, sum T_i], N = B * C channel-independent series (b * C + c) or B.

        Without calendar marks the embedding is the value term alone, a width-3 circular convolution
        over each scale's time axis: one gather of the three neighbours of every step from all scales
        at once, then one product with the weight [d_model, c_in * 3] (dropout as StepTokenEmbedding's).
        """
        embedding = self.enc_embedding
        if embedding.position is None and all(m is None for m in marks):
            series = torch.cat(xs, dim=1)  # [B, L, C], L = sum T_i
            batch, total, channels = series.shape
            taps = series.index_select(1, self.conv_taps).view(batch, 3, total, channels)
            if self.channel_independence:  # [3, B * C, L]: tap k of series b * C + c
                taps = taps.permute(1, 0, 3, 2).reshape(3, -1)
            else:  # [C * 3, B, L], the conv weight's (channel, tap) order
                taps = taps.permute(3, 1, 0, 2).reshape(channels * 3, -1)
            weight = embedding.value.conv.weight  # [d_model, c_in, 3]
            out = (weight.reshape(len(weight), -1) @ taps).view(len(weight), -1, total)
            return _dropout_(out, embedding.dropout, batch_dim=1)  # out: [d_model, N, L]
        if self.channel_independence:
            # every channel becomes its own univariate series: [B, T, C] -> [B * C, T, 1]
            marks = [None if m is None else self._pair_marks(m, x.shape[-1]) for x, m in zip(xs, marks)]
            xs = [x.transpose(1, 2).reshape(-1, x.shape[1], 1) for x in xs]
        return torch.cat([embedding(x, m).permute(2, 0, 1) for x, m in zip(xs, marks)], dim=-1)

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
        if not self.channel_independence:
            parts = [decomposition(x) for decomposition, x in zip(self.preprocess, xs)]
            xs, trends = [season for season, _ in parts], [trend for _, trend in parts]

        # The hidden state is feature-major with the scales side by side along time, [d_model, N, sum T_i]:
        # the time MLPs are products over the rows of each scale's [d_model * N, T_i] and the feature
        # MLPs over the columns of [d_model, N * sum T_i], with no transposed copy between the embedding
        # and the head.
        hidden = self._embed(xs, marks)
        for block in self.pdm_blocks:
            hidden = block(hidden)

        # Future-Multipredictor-Mixing: the sum over scales of projection(predict_i(h_i)). Both maps are
        # linear, so the projection over features (to 1 or c_out) goes first, making the maps over time
        # d_model / c_out times cheaper; the scales' maps then are one product with their weights side by
        # side, and the biases add up to one [c, P] term.
        projection = self.projection_layer
        width, series, total = hidden.shape
        projected = projection.weight @ hidden.view(width, -1)  # [c, N * sum T_i]
        weight = torch.cat([predict.weight for predict in self.predict_layers], dim=1)  # [P, sum T_i]
        bias = (projection.weight.sum(1, keepdim=True) * sum(predict.bias for predict in self.predict_layers)
                + projection.bias.unsqueeze(1) * len(self.predict_layers))  # [c, P]
        forecast = (projected.view(-1, total) @ weight.t()).view(-1, series, self.pred_len) + bias.unsqueeze(1)
        if self.channel_independence:
            forecast = forecast.view(batch, channels, self.pred_len).transpose(1, 2)
        else:
            forecast = forecast.permute(1, 2, 0)
            for trend, res, regression in zip(trends, self.out_res_layers, self.regression_layers):
                forecast = forecast + regression(res(trend.transpose(1, 2))).transpose(1, 2)
        if self.normalize_layers is not None:
            forecast = self.normalize_layers[0].denorm(forecast)
        return forecast
