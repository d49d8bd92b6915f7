"""TimesNet: embed the normalised window, extend it linearly over time to seq_len + pred_len steps, then let
each TimesBlock find the dominant periods by FFT, fold the series into 2-D [n_periods, period] grids, model
intra- and inter-period variation with 2-D Inception convolutions and merge the per-period results by their
spectral amplitudes. Wu et al., "TimesNet: Temporal 2D-Variation Modeling for General Time Series Analysis",
ICLR 2023; follows the TSLib implementation (long-term forecasting)."""
import torch
from torch import nn
from torch.nn import functional as F

from layers.embed import DataEmbedding
from layers.inception import InceptionBlock
from layers.normalization import InstanceNorm


class TimesBlock(nn.Module):
    """[B, T, d_model] -> [B, T, d_model]: amplitude-weighted sum of 2-D variation models over top_k periods,
    plus the input (residual)."""

    def __init__(self, d_model: int, d_ff: int, top_k: int, num_kernels: int, padding: str = "zeros"):
        super().__init__()
        if padding not in ("zeros", "tail"):
            raise ValueError(f"TimesNet padding must be zeros or tail, got {padding!r}")
        self.top_k = top_k
        self.padding = padding
        # Shared by every period (the paper's parameter-efficient design).
        self.conv = nn.Sequential(
            InceptionBlock(d_model, d_ff, num_kernels),
            nn.GELU(),
            InceptionBlock(d_ff, d_model, num_kernels),
        )

    def dominant_periods(self, x: torch.Tensor):
        """(periods, weights): top_k periods chosen from the whole batch's mean amplitude spectrum (as
        TSLib), and each sample's softmax over its own amplitudes at those frequencies, [B, k]."""
        # in fp32: cuFFT takes half precision only at power-of-two lengths (CUDA autocast does not upcast)
        amplitude = torch.fft.rfft(x.float(), dim=1).abs().mean(-1)  # [B, T // 2 + 1]
        k = min(self.top_k, amplitude.shape[1] - 1)
        # Frequency 0 is the mean level, not a period: rank only the others.
        _, top = torch.topk(amplitude[:, 1:].mean(0), k)
        top = top + 1
        weights = torch.softmax(amplitude[:, top], dim=1).to(x.dtype)  # gradients flow through the amplitudes, as in TSLib
        # The only host sync of the block: the grid shapes below need Python integers.
        periods = (x.shape[1] // top).tolist()
        return periods, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        periods, weights = self.dominant_periods(x)
        # Neighbouring frequencies can give the same integer period, hence the same 2-D result:
        # compute it once and give it the sum of their weights.
        slots_of_period = {}
        for slot, period in enumerate(periods):
            slots_of_period.setdefault(period, []).append(slot)

        # Every period runs the same two inception blocks: merge their kernels once, not once per
        # period (a third of a one-window forward's time).
        first, activation, second = self.conv  # kept as one Sequential: checkpoints keep conv.0 / conv.2 keys
        first_kernel, second_kernel = first.merged_kernel(), second.merged_kernel()
        out = x
        for period, slots in slots_of_period.items():
            rows = -(-length // period)
            missing = rows * period - length
            if self.padding == "tail" and missing:  # TSLib's 2023-02-18 code (230805f): repeat the last steps
                padded = torch.cat([x, x[:, length - missing:]], dim=1)
            else:  # TSLib's code since fd74cbc (2023-02-22): zeros at the end of the series
                padded = F.pad(x, (0, 0, 0, missing))
            # [B, C, rows, period]; left in channels-last layout, which the convolution accepts as is.
            grid = padded.reshape(batch, rows, period, channels).permute(0, 3, 1, 2)
            grid = second(activation(first(grid, first_kernel)), second_kernel)
            variation = grid.permute(0, 2, 3, 1).reshape(batch, rows * period, channels)[:, :length]
            weight = sum(weights[:, slot] for slot in slots)
            out = out + variation * weight[:, None, None]
        return out


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc")
    batch_dependent = ("the top_k periods are chosen from the batch's mean spectrum (TSLib's FFT_for_Period), so a "
                       "window's forecast depends on its batch-mates: test metrics vary with --batch_size and, "
                       "under DDP, with the world size")

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        # TSLib always normalises TimesNet's input for forecasting, whatever use_norm says.
        self.normalizer = InstanceNorm()
        self.enc_embedding = DataEmbedding(configs.enc_in, configs.d_model, getattr(configs, "mark_dim", 0) or 0,
                                           configs.dropout)
        self.predict_linear = nn.Linear(self.seq_len, self.seq_len + self.pred_len)
        self.blocks = nn.ModuleList(
            TimesBlock(configs.d_model, configs.d_ff, configs.top_k, configs.num_kernels,
                       getattr(configs, "times_padding", "zeros"))
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
