"""iTransformer: the Transformer turned on its side. Each variate's whole lookback window becomes one token
(time features join as extra tokens), self-attention mixes the variates, the feed-forward network works
within each variate, and one linear map turns every variate token into its forecast. Liu et al.,
"iTransformer: Inverted Transformers Are Effective for Time Series Forecasting", ICLR 2024; follows TSLib."""
from torch import nn

from layers.embed import DataEmbeddingInverted
from layers.encoder import Encoder, EncoderLayer
from layers.normalization import InstanceNorm


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc")

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.use_norm = bool(configs.use_norm)
        self.normalizer = InstanceNorm()
        self.embedding = DataEmbeddingInverted(configs.seq_len, configs.d_model, configs.dropout)
        self.encoder = Encoder(
            [
                EncoderLayer(configs.d_model, configs.n_heads, configs.d_ff, configs.dropout, configs.activation)
                for _ in range(configs.e_layers)
            ],
            configs.d_model,
        )
        self.projector = nn.Linear(configs.d_model, configs.pred_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"iTransformer expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        n_vars = x_enc.shape[-1]
        if self.use_norm:
            x_enc = self.normalizer.norm(x_enc)

        tokens = self.encoder(self.embedding(x_enc, x_mark_enc))  # [B, C (+ marks), d_model]
        # Time-feature tokens only inform the variates through attention; they are not forecast,
        # so project just the C variate tokens.
        out = self.projector(tokens[:, :n_vars]).transpose(1, 2)  # [B, pred_len, C]

        if self.use_norm:
            out = self.normalizer.denorm(out)
        return out
