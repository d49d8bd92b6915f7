"""TSMixer: a stack of all-MLP residual blocks that alternately mix along time (an MLP over the
seq_len steps of each channel) and across channels (an MLP over the enc_in values of each step), then
one linear map over time (seq_len -> pred_len). Chen et al., "TSMixer: An All-MLP Architecture for
Time Series Forecasting", TMLR 2023; follows the TSLib implementation, with optional instance
normalisation (the paper's RevIN) under configs.use_norm.

Dropout draws its masks itself (layers.dropout), a measured faster path: the four masks of a step in one
draw per sample (Model.dropout_masks), on the CPU 32 reseeds a step at batch 32 instead of 128; keying the
masks then costs 0.4-0.5 ms a step instead of 0.85 (10.5 ms a step, benchmarks/results/speed_notes.md)."""
from torch import nn

from layers.dropout import add_dropout, dropout_noises, shared_rate
from layers.mlp import mlp_over_columns, relu_mlp
from layers.normalization import InstanceNorm


class MixerBlock(nn.Module):
    """x + time-mixing MLP, then + channel-mixing MLP, on x laid out [L, B, C] (time-major).

    As TSLib: each MLP is Linear -> ReLU -> Linear -> Dropout with hidden width d_model, and there is
    no normalisation inside the block (the paper's batch norm is left out). ReLU is fixed, as in
    both the paper and TSLib, whatever configs.activation says.

    Time-major, both mixings are matrix products on views of x: time mixing on the columns of the
    [L, B * C] matrix (layers.mlp.mlp_over_columns), channel mixing on its [L * B, C] rows
    (layers.mlp.relu_mlp, whose backward suits the C-wide input).
    """

    def __init__(self, seq_len: int, channels: int, d_model: int, dropout: float):
        super().__init__()
        self.temporal = nn.Sequential(
            nn.Linear(seq_len, d_model), nn.ReLU(), nn.Linear(d_model, seq_len), nn.Dropout(dropout))
        self.channel = nn.Sequential(
            nn.Linear(channels, d_model), nn.ReLU(), nn.Linear(d_model, channels), nn.Dropout(dropout))

    def forward(self, x, noises=(None, None)):
        """x [L, B, C], contiguous; returns the same layout. `noises`: the two dropout masks, if drawn
        already (Model.dropout_masks)."""
        steps, _, channels = x.shape
        up, _, down, drop = self.temporal
        mixed = mlp_over_columns(x.view(steps, -1), up, down)  # over time, on [L, B * C] as it lies
        x = add_dropout(x, mixed.view_as(x), drop.p, self.training, noises[0], batch_dim=1)

        # the channel MLP's [L * B, d_model] hidden layer is TSMixer's one large tensor, and its narrow
        # input (C channels) makes autograd's weight gradient slow: relu_mlp's backward (layers/mlp.py).
        # Computed a cache-sized block at a time it measured slower (benchmarks/results/speed_notes.md).
        up, _, down, drop = self.channel
        rows = x.view(-1, channels)  # [L * B, C]
        mixed = relu_mlp(rows, up, down)
        return add_dropout(x, mixed.view_as(x), drop.p, self.training, noises[1], batch_dim=1)


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.normalize = InstanceNorm() if configs.use_norm else None
        # `model` and `projection` keep TSLib's state_dict keys (model.<i>.temporal.0.weight, ...).
        self.model = nn.ModuleList(
            MixerBlock(configs.seq_len, configs.enc_in, configs.d_model, configs.dropout)
            for _ in range(configs.e_layers))
        self.projection = nn.Linear(configs.seq_len, configs.pred_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"TSMixer expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        x = self.normalize.norm(x_enc) if self.normalize is not None else x_enc
        x = x.transpose(0, 1).contiguous()  # [L, B, C], the blocks' layout
        for block, noises in zip(self.model, self.dropout_masks(x)):
            x = block(x, noises)
        steps, batch, channels = x.shape
        out = self.projection(x.view(steps, -1).t())  # [B * C, pred_len]
        out = out.view(batch, channels, -1).transpose(1, 2)  # [B, pred_len, C]
        return self.normalize.denorm(out) if self.normalize is not None else out

    def dropout_masks(self, x):
        """Every block's two dropout masks for x [L, B, C], drawn at once (one draw per sample when masks
        follow the samples: on the CPU a reseed and a draw each, the dearest part of the masks) wherever
        layers.dropout draws masks itself; else pairs of Nones, and each dropout draws its own or runs
        F.dropout (layers.dropout.fused_dropout)."""
        drops = [module for block in self.model for module in (block.temporal[-1], block.channel[-1])]
        p = shared_rate(x, (d.p for d in drops), self.training)
        if p is None:
            return [(None, None)] * len(self.model)
        masks = dropout_noises(x, p, *[x.shape] * len(drops), batch_dims=[1] * len(drops))
        return list(zip(masks[0::2], masks[1::2]))

