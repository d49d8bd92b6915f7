"""TimeXer: forecasting endogenous series with the help of exogenous ones. Each endogenous series is cut
into patches, one token each, plus a learned global token; self-attention mixes a series' patch tokens and
its global token, the global token alone cross-attends to the exogenous variates (each whole series one
token, iTransformer-style, with the time features as further tokens), and a flatten head maps a series'
tokens to its forecast. Wang et al., "TimeXer: Empowering Transformers for Time Series Forecasting with
Exogenous Variables", NeurIPS 2024; follows TSLib's models/TimeXer.py.

Which series are endogenous follows TSLib: with --features MS (and here also with --covariate) the target,
the data's last column, is the one endogenous series and the other columns are its exogenous variables
(the output is [B, pred_len, 1]); with --features M (or S) every column is endogenous and every column
is also an exogenous token (TSLib's forecast_multi), so each series' global token reads all of them.

The blocks are TSLib's, from this repository's layers/ (Embed.PositionalEmbedding, Embed.DataEmbedding_inverted,
SelfAttention_Family.AttentionLayer around FullAttention, PatchTST.FlattenHead), built in TSLib's order, so the
state_dict keys are TSLib's (a TSLib TimeXer checkpoint loads strictly) and a seed gives TSLib's initial weights.
The feed-forward keeps TSLib's kernel-size-1 Conv1d parameters and applies them as linear maps (the same
function; the Conv1d call is slower on [tokens, d_model]). Patches are cut from the first step; a remainder of
seq_len % patch_len trailing steps is dropped, as TSLib's unfold drops it.
"""
import torch
import torch.nn.functional as F
from torch import nn

from layers.encoder import activation_fn
from layers.normalization import InstanceNorm
from layers.tslib.Embed import DataEmbedding_inverted, PositionalEmbedding
from layers.tslib.SelfAttention_Family import AttentionLayer, FullAttention
from models.PatchTST import FlattenHead


def exogenous_mode(configs) -> bool:
    """True when the target alone is forecast and the other columns are its exogenous variables."""
    return configs.features == "MS" or bool(getattr(configs, "covariate", False))


class EndogenousEmbedding(nn.Module):
    """Patch tokens of each endogenous series plus its learned global token:
    [B, n_vars, L] -> [B * n_vars, patch_num + 1, d_model] (sample-major, the global token last)."""

    def __init__(self, n_vars: int, d_model: int, patch_len: int, dropout: float):
        super().__init__()
        self.patch_len = patch_len
        self.value_embedding = nn.Linear(patch_len, d_model, bias=False)
        self.glb_token = nn.Parameter(torch.randn(1, n_vars, 1, d_model))
        self.position_embedding = PositionalEmbedding(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        batch, n_vars, _ = series.shape
        patches = self.value_embedding(series.unfold(-1, self.patch_len, self.patch_len))  # [B, n, P, d]
        patches = patches + self.position_embedding(patches[0])  # positions over the patches, as TSLib's
        tokens = torch.cat([patches, self.glb_token.expand(batch, -1, -1, -1)], dim=2)
        return self.dropout(tokens.flatten(0, 1))


def _attention(configs) -> AttentionLayer:
    inner = FullAttention(False, configs.factor, attention_dropout=configs.dropout, output_attention=False)
    return AttentionLayer(inner, configs.d_model, configs.n_heads)


class TimeXerBlock(nn.Module):
    """Patch-wise self-attention over a series' tokens, variate-wise cross-attention from its global
    token to the exogenous tokens, then the feed-forward network on every token; post-norm throughout."""

    def __init__(self, self_attention, cross_attention, d_model: int, d_ff: int, dropout: float, activation: str):
        super().__init__()
        self.self_attention, self.cross_attention = self_attention, cross_attention
        self.conv1 = nn.Conv1d(in_channels=d_model, out_channels=d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(in_channels=d_ff, out_channels=d_model, kernel_size=1)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation_fn(activation)

    def forward(self, x: torch.Tensor, exogenous: torch.Tensor) -> torch.Tensor:
        """x [B * n_vars, P + 1, d_model] (global token last), exogenous [B, N_ex, d_model]."""
        x = self.norm1(x + self.dropout(self.self_attention(x, x, x, None)[0]))
        batch, d_model = exogenous.shape[0], x.shape[-1]
        glb = x[:, -1:].reshape(batch, -1, d_model)  # a sample's global tokens are its cross-attention queries
        glb = glb + self.dropout(self.cross_attention(glb, exogenous, exogenous, None)[0])
        x = torch.cat([x[:, :-1], self.norm2(glb).reshape(-1, 1, d_model)], dim=1)
        hidden = self.dropout(self.activation(F.linear(x, self.conv1.weight.squeeze(-1), self.conv1.bias)))
        return self.norm3(x + self.dropout(F.linear(hidden, self.conv2.weight.squeeze(-1), self.conv2.bias)))


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc")

    def __init__(self, configs):
        super().__init__()
        if configs.seq_len < configs.patch_len:
            raise ValueError(f"TimeXer cuts --seq_len {configs.seq_len} into patches of --patch_len "
                             f"{configs.patch_len}: give a patch_len no longer than seq_len")
        self.seq_len, self.pred_len = configs.seq_len, configs.pred_len
        self.exogenous = exogenous_mode(configs)
        self.use_norm = bool(configs.use_norm)
        self.normalizer = InstanceNorm()
        if self.exogenous and configs.enc_in < 2:
            raise ValueError("TimeXer with --features MS or --covariate reads the other columns as exogenous "
                             "variables, but the data has a single column: use --features S")
        n_vars = 1 if self.exogenous else configs.enc_in
        d_model, patch_num = configs.d_model, configs.seq_len // configs.patch_len
        self.en_embedding = EndogenousEmbedding(n_vars, d_model, configs.patch_len, configs.dropout)
        self.ex_embedding = DataEmbedding_inverted(configs.seq_len, d_model, configs.embed, configs.freq,
                                                   configs.dropout)
        self.encoder = nn.ModuleDict({
            "layers": nn.ModuleList(TimeXerBlock(_attention(configs), _attention(configs), d_model, configs.d_ff,
                                                 configs.dropout, configs.activation)
                                    for _ in range(configs.e_layers)),
            "norm": nn.LayerNorm(d_model)})
        self.head = FlattenHead(configs.enc_in, d_model * (patch_num + 1), configs.pred_len, configs.dropout)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"TimeXer expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        if self.use_norm:
            x_enc = self.normalizer.norm(x_enc)  # every column, exogenous ones included, as TSLib
        endogenous = x_enc[..., -1:] if self.exogenous else x_enc
        exogenous = x_enc[..., :-1] if self.exogenous else x_enc
        x = self.en_embedding(endogenous.transpose(1, 2))
        cross = self.ex_embedding(exogenous, x_mark_enc)
        for layer in self.encoder["layers"]:
            x = layer(x, cross)
        x = self.encoder["norm"](x)
        tokens = x.reshape(x_enc.shape[0], endogenous.shape[-1], *x.shape[1:]).transpose(-1, -2)  # [B, n, d, P+1]
        out = self.head(tokens).transpose(1, 2)  # [B, pred_len, n_vars]
        if self.use_norm:
            out = self.normalizer.denorm(out)  # the last n_vars columns' statistics: the target's with MS
        return out
