"""TiDE: a channel-independent MLP encoder-decoder. Each channel's instance-normalised lookback,
flattened together with low-dimensional projections of the time features of the lookback and the
horizon, is encoded by residual MLP blocks, decoded into a small vector per horizon step, and a
temporal decoder turns each step's vector plus its projected time features into the forecast; a
linear map from lookback to horizon is added as a global residual. Das et al., "Long-term Forecasting
with TiDE: Time-series Dense Encoder", TMLR 2023; follows the TSLib implementation (one difference:
NORMALIZE_ONE_WIDE_OUTPUT below). Time features of the horizon are the last pred_len rows of x_mark_dec."""
import torch
from torch import nn

from layers.normalization import InstanceNorm

# Width each step's time features are projected to before they join the encoder input and the
# temporal decoder (TSLib's feature_encode_dim; the paper's "temporal width"). As in TSLib, the
# projection ends in a LayerNorm, which over two values leaves only their order (+-weight + bias).
FEATURE_ENCODE_DIM = 2
# TSLib (like the original code with layer norm on) also layer-normalises the temporal decoder's
# one-wide output. Normalising a single value returns the LayerNorm's bias whatever the input, so
# the temporal decoder becomes a constant and the feature encoder, dense encoder and dense decoder
# get zero gradient: the model is then a linear map on the normalised lookback plus a constant.
# False skips that LayerNorm so every block learns (same ETTh1 accuracy, test MSE 0.385 at horizon
# 96 either way); True reproduces TSLib exactly, state_dict included.
NORMALIZE_ONE_WIDE_OUTPUT = False


class ResBlock(nn.Module):
    """TiDE's residual block: LayerNorm(Dropout(fc2(ReLU(fc1(x)))) + fc3(x)), the LayerNorm left out
    for a one-wide output unless NORMALIZE_ONE_WIDE_OUTPUT."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)
        self.fc3 = nn.Linear(input_dim, output_dim)  # linear skip connection
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(output_dim) if output_dim > 1 or NORMALIZE_ONE_WIDE_OUTPUT else None

    def forward(self, x):
        # in-place ReLU: the temporal decoder's hidden tensor is [B * C, pred_len, d_ff], the largest
        # activation of the model; fc1's output is not needed for its backward
        out = self.dropout(self.fc2(torch.relu_(self.fc1(x)))) + self.fc3(x)
        return self.ln(out) if self.ln is not None else out


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc", "x_mark_dec")
    not_from_data = ("c_out",)  # the decoded width per step (below), not a channel count

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.mark_dim = int(getattr(configs, "mark_dim", 0) or 0)
        # TSLib takes the per-step decoded width from c_out (its scripts pass --c_out 8, the paper's
        # decoderOutputDim); the output still has one column per input channel.
        self.decode_dim = configs.c_out
        hidden, dropout = configs.d_model, configs.dropout
        feature_dim = FEATURE_ENCODE_DIM if self.mark_dim else 0  # no covariates for undated data
        self.normalize = InstanceNorm() if getattr(configs, "use_norm", 1) else None

        if self.mark_dim:
            self.feature_encoder = ResBlock(self.mark_dim, hidden, FEATURE_ENCODE_DIM, dropout)
        flatten_dim = self.seq_len + (self.seq_len + self.pred_len) * feature_dim
        # Names keep TSLib's state_dict keys. With e_layers or d_layers > 2, TSLib reuses one block
        # object for the repeated hidden layers (shared weights); here each layer has its own.
        self.encoders = nn.Sequential(
            ResBlock(flatten_dim, hidden, hidden, dropout),
            *(ResBlock(hidden, hidden, hidden, dropout) for _ in range(configs.e_layers - 1)))
        self.decoders = nn.Sequential(
            *(ResBlock(hidden, hidden, hidden, dropout) for _ in range(configs.d_layers - 1)),
            ResBlock(hidden, hidden, self.decode_dim * self.pred_len, dropout))
        self.temporalDecoder = ResBlock(self.decode_dim + feature_dim, configs.d_ff, 1, dropout)
        self.residual_proj = nn.Linear(self.seq_len, self.pred_len)

    def _covariates(self, x_enc, x_mark_enc, x_mark_dec):
        """Time features of the lookback and the horizon, [B, seq_len + pred_len, mark_dim]."""
        if x_mark_enc is None or x_mark_dec is None:  # as TSLib: zeros when no marks are passed
            return x_enc.new_zeros(x_enc.shape[0], self.seq_len + self.pred_len, self.mark_dim)
        return torch.cat([x_mark_enc, x_mark_dec[:, -self.pred_len:]], dim=1)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"TiDE expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        batch, _, channels = x_enc.shape
        x = self.normalize.norm(x_enc) if self.normalize is not None else x_enc
        # Channel independence: fold the channels into the batch, [B * C, L].
        series = x.transpose(1, 2).reshape(batch * channels, self.seq_len)

        encoder_in, step_features = series, None
        if self.mark_dim:
            features = self.feature_encoder(self._covariates(x_enc, x_mark_enc, x_mark_dec))  # [B, L+H, F]
            features = features.repeat_interleave(channels, dim=0)  # the same calendar for every channel
            encoder_in = torch.cat([series, features.flatten(1)], dim=-1)
            step_features = features[:, self.seq_len:]  # [B * C, H, F]

        decoded = self.decoders(self.encoders(encoder_in)).view(-1, self.pred_len, self.decode_dim)
        if step_features is not None:
            decoded = torch.cat([step_features, decoded], dim=-1)
        out = self.temporalDecoder(decoded).squeeze(-1) + self.residual_proj(series)  # [B * C, H]

        out = out.view(batch, channels, self.pred_len).transpose(1, 2)
        return self.normalize.denorm(out) if self.normalize is not None else out
