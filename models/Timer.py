"""Timer: a decoder-only (GPT-style) Transformer over patch tokens of each channel on its own.
Every channel's series is cut into non-overlapping patches of `input_token_len`, each patch is
embedded linearly with a sinusoidal position, causal self-attention runs over that channel's
tokens only, and every token predicts the next `output_token_len` steps. Liu et al., "Timer:
Generative Pre-trained Transformers Are Large Time Series Models", ICML 2024; follows OpenLTM."""
from torch import nn

from layers.causal_attention import CausalSelfAttention
from layers.embedding import SinusoidalPositions
from layers.normalization import InstanceNorm
from layers.transformer import TimerBlock, TimerLayer, series_to_patches, token_forecasts_to_series
from utils import openltm


class Model(nn.Module):
    autoregressive = True
    inputs_used = ("x_enc",)
    checkpoint_adapters = (openltm.TIMER,)  # OpenLTM's files load converted

    def __init__(self, configs):
        super().__init__()
        self.input_token_len = configs.input_token_len
        self.output_token_len = configs.output_token_len
        self.use_norm = bool(configs.use_norm)
        self.norm = InstanceNorm()
        # No bias and absolute sinusoidal positions (not RoPE), as OpenLTM's Timer.
        self.embedding = nn.Linear(self.input_token_len, configs.d_model, bias=False)
        self.position = SinusoidalPositions(configs.d_model)
        self.dropout = nn.Dropout(configs.dropout)
        self.blocks = TimerBlock(
            [
                TimerLayer(
                    CausalSelfAttention(configs.d_model, configs.n_heads, dropout=configs.dropout),
                    configs.d_model, configs.d_ff, dropout=configs.dropout, activation=configs.activation,
                )
                for _ in range(configs.e_layers)
            ],
            configs.d_model,
        )
        self.head = nn.Linear(configs.d_model, self.output_token_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, _, n_vars = x_enc.shape

        if self.use_norm:
            # Whole-window statistics, as OpenLTM (early tokens thus see later inputs' mean/std).
            x_enc = self.norm.norm(x_enc)

        # Channel independence: each channel becomes its own sequence of tokens.
        patches = series_to_patches(x_enc, self.input_token_len)  # [B, C, N, P]
        n_tokens = patches.shape[2]
        tokens = self.embedding(patches).reshape(batch * n_vars, n_tokens, -1)  # [B * C, N, D]
        tokens = self.dropout(tokens + self.position(tokens))
        tokens = self.blocks(tokens, 1, n_tokens)
        out = self.head(tokens)  # [B * C, N, output_token_len]
        out = token_forecasts_to_series(out, batch, n_vars)  # [B, N * output_token_len, C]

        if self.use_norm:
            out = self.norm.denorm(out)
        return out
