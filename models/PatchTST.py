"""PatchTST: every channel is forecast on its own (channel independence) from its instance-normalised
lookback, cut into overlapping patches that become the tokens of a Transformer encoder; a flatten head maps
all patch representations of a channel linearly to the horizon. Nie et al., "A Time Series is Worth 64
Words: Long-term Forecasting with Transformers", ICLR 2023; supervised version, as in TSLib."""
from torch import nn

from layers.embedding import PatchTokenEmbedding
from layers.encoder import EncoderBlock, EncoderStack
from layers.normalization import InstanceNorm

# TSLib's PatchTST keeps its generic encoder layers (LayerNorm after attention and feed-forward) and puts
# BatchNorm only after the last layer; the paper's own code uses BatchNorm inside every layer instead.
LAYER_NORM = "layer"
FINAL_NORM = "batch"


class FlattenHead(nn.Module):
    """[..., d_model, N] -> [..., target_window]: one linear map over a series' flattened patch features,
    d_model-major. TSLib's signature and keys: TSLib's Crossformer imports it from models.PatchTST."""

    def __init__(self, n_vars, nf, target_window, head_dropout=0):
        super().__init__()
        self.n_vars = n_vars
        self.flatten = nn.Flatten(start_dim=-2)
        self.linear = nn.Linear(nf, target_window)
        self.dropout = nn.Dropout(head_dropout)

    def forward(self, x):
        return self.dropout(self.linear(self.flatten(x)))


class PatchFlattenHead(FlattenHead):
    """FlattenHead on the encoder's [B * C, N, d_model] tokens -> [B * C, pred_len]."""

    def __init__(self, n_features: int, pred_len: int, dropout: float):
        super().__init__(None, n_features, pred_len, dropout)

    def forward(self, tokens):
        return super().forward(tokens.transpose(1, 2))  # d_model-major, the layout of TSLib's head weights


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        # Always on: TSLib's PatchTST normalises every window regardless of use_norm.
        self.normalization = InstanceNorm()
        patch_len, stride = getattr(configs, "patch_len", 16), getattr(configs, "stride", 8)  # TSLib's defaults
        self.patch_embedding = PatchTokenEmbedding(configs.d_model, patch_len, stride, configs.dropout)
        self.encoder = EncoderStack(
            [
                EncoderBlock(configs.d_model, configs.n_heads, configs.d_ff, configs.dropout,
                             configs.activation, norm=LAYER_NORM)
                for _ in range(configs.e_layers)
            ],
            configs.d_model,
            norm=FINAL_NORM,
        )
        n_patches = PatchTokenEmbedding.n_patches(configs.seq_len, patch_len, stride)
        if n_patches < 1:
            raise ValueError(f"seq_len {configs.seq_len} is too short for patch_len {patch_len} with stride {stride}")
        self.head = PatchFlattenHead(configs.d_model * n_patches, configs.pred_len, configs.dropout)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"PatchTST expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        batch, _, channels = x_enc.shape
        x_enc = self.normalization.norm(x_enc)
        series = x_enc.transpose(1, 2).reshape(batch * channels, self.seq_len)  # one sample per channel
        tokens = self.encoder(self.patch_embedding(series))  # [B * C, N, d_model]
        forecast = self.head(tokens).view(batch, channels, self.pred_len).transpose(1, 2)
        return self.normalization.denorm(forecast)
