"""Timer-XL: a decoder-only Transformer over patch tokens of all variables at once. Each variable's series
is cut into non-overlapping patches, every patch becomes a token, and the C * N tokens attend to each other
under a Kronecker mask (all variables, causal in time) with rotary time positions and a learned
same/different-variable bias; every token predicts the next `output_token_len` steps. Liu et al.,
"Timer-XL: Long-Context Transformers for Unified Time Series Forecasting", ICLR 2025; follows OpenLTM."""
from torch import nn

from layers.attention import TimeAttention
from layers.normalization import InstanceNorm
from layers.transformer import TimerBlock, TimerLayer, series_to_patches, token_forecasts_to_series
from utils import openltm


class Model(nn.Module):
    autoregressive = True
    inputs_used = ("x_enc",)
    checkpoint_adapters = (openltm.TIMER_XL,)  # OpenLTM's files load converted

    def __init__(self, configs):
        super().__init__()
        self.input_token_len = configs.input_token_len
        self.output_token_len = configs.output_token_len
        self.use_norm = bool(configs.use_norm)
        self.norm = InstanceNorm()
        dropout = configs.dropout
        # "paper" (the default) or "openltm": what OpenLTM's code computes, the same on one variable
        # (layers/attention.py TimeAttention; docs/openltm.md)
        self.attention_kind = getattr(configs, "timerxl_attention", "paper")
        self.embedding = nn.Linear(self.input_token_len, configs.d_model)
        self.blocks = TimerBlock(
            [
                TimerLayer(
                    TimeAttention(configs.d_model, configs.n_heads, dropout=dropout,
                                  covariate=bool(configs.covariate),
                                  kind=self.attention_kind),
                    configs.d_model, configs.d_ff, dropout=dropout,
                    activation=configs.activation,
                )
                for _ in range(configs.e_layers)
            ],
            configs.d_model,
        )
        self.head = nn.Linear(configs.d_model, self.output_token_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, _, n_vars = x_enc.shape

        if self.use_norm:
            # Statistics over the whole window, as OpenLTM: note this lets early tokens see later
            # inputs through the mean/std; use use_norm=False for strictly causal outputs.
            x_enc = self.norm.norm(x_enc)

        patches = series_to_patches(x_enc, self.input_token_len)  # [B, C, N, P]
        n_tokens = patches.shape[2]
        tokens = self.embedding(patches).reshape(batch, n_vars * n_tokens, -1)  # variable-major: c * N + n
        tokens = self.blocks(tokens, n_vars, n_tokens)
        out = self.head(tokens)  # [B, C * N, output_token_len]
        out = token_forecasts_to_series(out, batch, n_vars)  # [B, N * output_token_len, C]

        if self.use_norm:
            out = self.norm.denorm(out)
        return out
