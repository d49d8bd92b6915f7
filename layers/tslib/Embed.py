"""TSLib's input embeddings under its names, signatures and state_dict keys (Time-Series-Library,
layers/Embed.py), so that TSLib's model files import them unchanged and its checkpoints load.

Written here on layers/embedding.py's functions (circular_token_conv, cut_patches) and
utils.positions.sinusoid_table, the ones this codebase's own models embed with. Positions and the value
convolution are those of the Transformer (Vaswani et al., NeurIPS 2017) as Informer (Zhou et al., AAAI 2021)
adapted them to series; DataEmbedding_inverted is iTransformer's (Liu et al., ICLR 2024), PatchEmbedding
PatchTST's (Nie et al., ICLR 2023). Dropout is a plain nn.Dropout: the experiment keys it by the sample
(layers/dropout.py).
"""
import torch
from torch import nn

from layers.embedding import circular_token_conv, cut_patches
from utils.positions import sinusoid_table

# TSLib's `timeF` feature count per --freq; other spellings (15min, 10s) go by their unit.
TIME_FEATURES = {"h": 4, "t": 5, "s": 6, "m": 1, "a": 1, "w": 2, "d": 3, "b": 3}


class PositionalEmbedding(nn.Module):
    """[1, L, d_model] sinusoidal positions for an input [B, L, ...]; `pe` is a saved buffer, as in TSLib."""

    def __init__(self, d_model, max_len=5000):
        super().__init__()
        self.register_buffer("pe", sinusoid_table(max_len, d_model).unsqueeze(0))

    def forward(self, x):
        return self.pe[:, :x.size(1)]


class TokenEmbedding(nn.Module):
    """[B, L, c_in] -> [B, L, d_model] by a width-3 circular convolution over time."""

    def __init__(self, c_in, d_model):
        super().__init__()
        self.tokenConv = circular_token_conv(c_in, d_model)

    def forward(self, x):
        return self.tokenConv(x.transpose(1, 2)).transpose(1, 2)


class FixedEmbedding(nn.Module):
    """A frozen lookup table of sinusoids: integer calendar values -> d_model."""

    def __init__(self, c_in, d_model):
        super().__init__()
        self.emb = nn.Embedding(c_in, d_model)  # built as TSLib builds it, so the random stream advances alike
        self.emb.weight = nn.Parameter(sinusoid_table(c_in, d_model), requires_grad=False)

    def forward(self, x):
        return self.emb(x).detach()


class TemporalEmbedding(nn.Module):
    """Integer calendar features (month, day, weekday, hour[, quarter-hour]; --embed fixed or learned) ->
    the sum of one table per feature: frozen sinusoids (`fixed`) or learned (`learned`)."""

    def __init__(self, d_model, embed_type='fixed', freq='h'):
        super().__init__()
        table = FixedEmbedding if embed_type == 'fixed' else nn.Embedding
        if freq == 't':
            self.minute_embed = table(4, d_model)
        self.hour_embed = table(24, d_model)
        self.weekday_embed = table(7, d_model)
        self.day_embed = table(32, d_model)
        self.month_embed = table(13, d_model)

    def forward(self, x):
        x = x.long()
        minute = self.minute_embed(x[:, :, 4]) if hasattr(self, 'minute_embed') else 0.
        return (self.hour_embed(x[:, :, 3]) + self.weekday_embed(x[:, :, 2]) + self.day_embed(x[:, :, 1])
                + self.month_embed(x[:, :, 0]) + minute)


def time_feature_count(freq):
    """How many `timeF` features a step of frequency `freq` has (TSLib's table; 15min counts as t)."""
    unit = freq.lstrip("0123456789").lower()  # '15min' counts as 't', as the data provider's calendar does
    unit = {"min": "t", "ms": "s"}.get(unit, unit)
    if unit == "y":  # not in TSLib's table: the data provider gives a yearly series no calendar feature
        return 0
    if unit not in TIME_FEATURES:
        raise ValueError(f"unknown freq '{freq}'; use one of {', '.join(TIME_FEATURES)}, optionally with a multiplier")
    return TIME_FEATURES[unit]


class TimeFeatureEmbedding(nn.Module):
    """`timeF` time features [B, L, F] -> d_model by one linear map without bias."""

    def __init__(self, d_model, embed_type='timeF', freq='h'):
        super().__init__()
        self.embed = nn.Linear(time_feature_count(freq), d_model, bias=False)

    def forward(self, x):
        return self.embed(x)


def _dated(x_mark):
    """Whether x_mark holds time features: undated data gives None or [B, L, 0] (the temporal term is left out)."""
    return x_mark is not None and x_mark.shape[-1] > 0


def _temporal(d_model, embed_type, freq):
    if embed_type == 'timeF':
        return TimeFeatureEmbedding(d_model=d_model, embed_type=embed_type, freq=freq)
    return TemporalEmbedding(d_model=d_model, embed_type=embed_type, freq=freq)


class DataEmbedding(nn.Module):
    """value + position (+ calendar, when x_mark is given) embedding of every step, then dropout."""

    def __init__(self, c_in, d_model, embed_type='fixed', freq='h', dropout=0.1):
        super().__init__()
        self.value_embedding = TokenEmbedding(c_in=c_in, d_model=d_model)
        self.position_embedding = PositionalEmbedding(d_model=d_model)
        self.temporal_embedding = _temporal(d_model, embed_type, freq)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, x_mark):
        out = self.value_embedding(x)
        if _dated(x_mark):
            out = out + self.temporal_embedding(x_mark)
        return self.dropout(out + self.position_embedding(x))


class DataEmbedding_inverted(nn.Module):
    """iTransformer's tokens: each variate's whole series (and each time feature's) -> one d_model token."""

    def __init__(self, c_in, d_model, embed_type='fixed', freq='h', dropout=0.1):
        super().__init__()
        self.value_embedding = nn.Linear(c_in, d_model)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, x_mark):
        x = x.transpose(1, 2)  # [B, variates, time]
        if _dated(x_mark):
            x = torch.cat([x, x_mark.transpose(1, 2)], 1)
        return self.dropout(self.value_embedding(x))


class DataEmbedding_wo_pos(nn.Module):
    """DataEmbedding without the positions (Autoformer's and FEDformer's); TSLib still builds, and saves,
    the position table, so its checkpoints hold `position_embedding.pe`."""

    def __init__(self, c_in, d_model, embed_type='fixed', freq='h', dropout=0.1):
        super().__init__()
        self.value_embedding = TokenEmbedding(c_in=c_in, d_model=d_model)
        self.position_embedding = PositionalEmbedding(d_model=d_model)
        self.temporal_embedding = _temporal(d_model, embed_type, freq)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, x_mark):
        out = self.value_embedding(x)
        if _dated(x_mark):
            out = out + self.temporal_embedding(x_mark)
        return self.dropout(out)


class PatchEmbedding(nn.Module):
    """PatchTST's patches: [B, C, L] -> ([B * C, N, d_model], C); the end padded by `padding` repeats of
    the last step, a patch of `patch_len` every `stride` steps, projected and given positions."""

    def __init__(self, d_model, patch_len, stride, padding, dropout):
        super().__init__()
        self.patch_len = patch_len
        self.stride = stride
        self.padding_patch_layer = nn.ReplicationPad1d((0, padding))
        self.value_embedding = nn.Linear(patch_len, d_model, bias=False)
        self.position_embedding = PositionalEmbedding(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        n_vars = x.shape[1]
        patches = cut_patches(x.flatten(0, 1), self.padding_patch_layer, self.patch_len, self.stride)
        x = self.value_embedding(patches)
        return self.dropout(x + self.position_embedding(x)), n_vars
