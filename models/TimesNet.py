"""TimesNet: embed the normalised window, extend it linearly over time to seq_len + pred_len steps, then let
each TimesBlock find the dominant periods by FFT, fold the series into 2-D [n_periods, period] grids, model
intra- and inter-period variation with 2-D Inception convolutions and merge the per-period results by their
spectral amplitudes. Wu et al., "TimesNet: Temporal 2D-Variation Modeling for General Time Series Analysis",
ICLR 2023; follows the TSLib implementation (long-term forecasting)."""
import torch
from torch import nn
from torch.nn import functional as F

from layers.embedding import StepTokenEmbedding
from layers.inception import InceptionBlock
from layers.normalization import InstanceNorm


class TimesBlock(nn.Module):
    """[B, T, d_model] -> [B, T, d_model]: amplitude-weighted sum of 2-D variation models over top_k periods,
    plus the input (residual)."""

    def __init__(self, d_model: int, d_ff: int, top_k: int, num_kernels: int, padding: str = "zeros",
                 eval_periods: str = "window"):
        super().__init__()
        if padding not in ("zeros", "tail"):
            raise ValueError(f"TimesNet padding must be zeros or tail, got {padding!r}")
        if eval_periods not in ("window", "batch"):
            raise ValueError(f"TimesNet eval_periods must be window or batch, got {eval_periods!r}")
        self.top_k = top_k
        self.padding = padding
        self.eval_periods = eval_periods
        # Shared by every period (the paper's parameter-efficient design).
        self.conv = nn.Sequential(
            InceptionBlock(d_model, d_ff, num_kernels),
            nn.GELU(),
            InceptionBlock(d_ff, d_model, num_kernels),
        )

    def dominant_periods(self, x: torch.Tensor):
        """(periods [B, k] as lists of ints, weights [B, k]): the top_k periods of the whole batch's mean
        amplitude spectrum (TSLib; every row the same), or in evaluation with eval_periods "window" each
        window's own (what the batch's would be were it scored alone), and each sample's softmax over its
        own amplitudes at its periods' frequencies."""
        # in fp32: cuFFT takes half precision only at power-of-two lengths (CUDA autocast does not upcast)
        amplitude = torch.fft.rfft(x.float(), dim=1).abs().mean(-1)  # [B, T // 2 + 1]
        k = min(self.top_k, amplitude.shape[1] - 1)
        # Frequency 0 is the mean level, not a period: rank only the others.
        if self.training or self.eval_periods == "batch":
            top = torch.topk(amplitude[:, 1:].mean(0), k).indices.expand(len(x), k) + 1
        else:
            top = torch.topk(amplitude[:, 1:], k, dim=1).indices + 1
        # gradients flow through the amplitudes, as in TSLib
        weights = torch.softmax(amplitude.gather(1, top), dim=1).to(x.dtype)
        # The only host sync of the block: the grid shapes below need Python integers.
        periods = (x.shape[1] // top).tolist()
        return periods, weights

    @staticmethod
    def rows_on_device(periods, rows_of_period, device):
        """{period: (its rows' indices, whether each of their top_k slots holds it)} on `device`, from ONE
        host-to-device copy a block (was two and a list index per period): [row, slot flags] of every period's
        rows in turn, then cut."""
        packed = torch.tensor([[row, *(p == period for p in periods[row])]
                               for period, rows in rows_of_period.items() for row in rows], device=device)
        pieces = packed.split([len(rows) for rows in rows_of_period.values()])
        return {period: (piece[:, 0], piece[:, 1:].bool()) for period, piece in zip(rows_of_period, pieces)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, length, channels = x.shape
        periods, weights = self.dominant_periods(x)
        # Each period's 2-D result is computed once for the windows that have it among their top_k (all
        # of them when the batch chooses), weighted by the sum of their weights at it: neighbouring
        # frequencies can give the same integer period.
        rows_of_period = {}
        for row, row_periods in enumerate(periods):
            for period in row_periods:
                rows_of_period.setdefault(period, {})[row] = None  # a dict: ordered, no repeats
        same_periods = all(row == periods[0] for row in periods)  # the batch chose (training, or batch mode)

        # Every period runs the same two inception blocks: merge their kernels once, not once per
        # period (a third of a one-window forward's time).
        first, activation, second = self.conv  # kept as one Sequential: checkpoints keep conv.0 / conv.2 keys
        first_kernel, second_kernel = first.merged_kernel(), second.merged_kernel()
        out = x
        rows_on_device = {} if same_periods else self.rows_on_device(periods, rows_of_period, x.device)
        for period, rows in rows_of_period.items():
            if not same_periods:
                index, at_period = rows_on_device[period]
            series = x if same_periods else x.index_select(0, index)
            grid_rows = -(-length // period)
            missing = grid_rows * period - length
            if self.padding == "tail" and missing:  # TSLib's 2023-02-18 code (230805f): repeat the last steps
                padded = torch.cat([series, series[:, length - missing:]], dim=1)
            else:  # TSLib's code since fd74cbc (2023-02-22): zeros at the end of the series
                padded = F.pad(series, (0, 0, 0, missing))
            # [B, C, rows, period]; left in channels-last layout, which the convolution accepts as is.
            grid = padded.reshape(len(rows), grid_rows, period, channels).permute(0, 3, 1, 2)
            grid = second(activation(first(grid, first_kernel)), second_kernel)
            variation = grid.permute(0, 2, 3, 1).reshape(len(rows), grid_rows * period, channels)[:, :length]
            if same_periods:
                weight = sum(weights[:, slot] for slot, p in enumerate(periods[0]) if p == period)
                out = out + variation * weight[:, None, None]
            else:  # each window's own periods: this one's rows, each weighted at its slots holding it
                weight = (weights.index_select(0, index) * at_period).sum(1)
                out = out.index_add(0, index, variation * weight[:, None, None])
        return out


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc")
    batch_dependent = ("in training the top_k periods are chosen from the batch's mean spectrum (TSLib's "
                       "FFT_for_Period), so a window's gradient depends on its batch-mates; evaluation takes each "
                       "window's own unless --times_eval_periods batch, when test metrics vary with the batch and "
                       "the world size")

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        # TSLib always normalises TimesNet's input for forecasting, whatever use_norm says.
        self.normalizer = InstanceNorm()
        self.enc_embedding = StepTokenEmbedding(configs.enc_in, configs.d_model, getattr(configs, "mark_dim", 0) or 0,
                                           configs.dropout)
        self.predict_linear = nn.Linear(self.seq_len, self.seq_len + self.pred_len)
        self.blocks = nn.ModuleList(
            TimesBlock(configs.d_model, configs.d_ff, configs.top_k, configs.num_kernels,
                       getattr(configs, "times_padding", "zeros"), getattr(configs, "times_eval_periods", "window"))
            for _ in range(configs.e_layers)
        )
        self.layer_norm = nn.LayerNorm(configs.d_model)  # one norm shared after every block, as TSLib
        self.projection = nn.Linear(configs.d_model, configs.c_out)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"TimesNet expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        x = self.normalizer.norm(x_enc)
        hidden = self.enc_embedding(x, x_mark_enc)  # [B, seq_len, d_model]
        hidden = self.predict_linear(hidden.transpose(1, 2)).transpose(1, 2)  # [B, seq_len + pred_len, d_model]
        for block in self.blocks:
            hidden = self.layer_norm(block(hidden))
        # The projection acts step by step and only the horizon is returned: project just that.
        out = self.projection(hidden[:, -self.pred_len:])
        return self.normalizer.denorm(out)
