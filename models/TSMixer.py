"""TSMixer: a stack of all-MLP residual blocks that alternately mix along time (an MLP over the
seq_len steps of each channel) and across channels (an MLP over the enc_in values of each step), then
one linear map over time (seq_len -> pred_len). Chen et al., "TSMixer: An All-MLP Architecture for
Time Series Forecasting", TMLR 2023; follows the TSLib implementation, with optional instance
normalisation (the paper's RevIN) under configs.use_norm."""
import torch
import torch.nn.functional as F
from torch import nn

from layers.cache_blocked import runs_blocked
from layers.dropout import Dropout, add_dropout
from layers.normalization import InstanceNorm


class MixerBlock(nn.Module):
    """x + time-mixing MLP, then + channel-mixing MLP, on x laid out [L, B, C] (time-major).

    As TSLib: each MLP is Linear -> ReLU -> Linear -> Dropout with hidden width d_model, and there is
    no normalisation inside the block (the paper's batch norm is left out). ReLU is fixed, as in
    both the paper and TSLib, whatever configs.activation says.

    Time-major, both mixings are plain matrix products on views of x with no copies: time mixing works
    on the [B * C, L] transpose of the [L, B * C] matrix, channel mixing on its [L * B, C] rows.
    """

    def __init__(self, seq_len: int, channels: int, d_model: int, dropout: float):
        super().__init__()
        self.temporal = nn.Sequential(
            nn.Linear(seq_len, d_model), nn.ReLU(), nn.Linear(d_model, seq_len), Dropout(dropout))
        self.channel = nn.Sequential(
            nn.Linear(channels, d_model), nn.ReLU(), nn.Linear(d_model, channels), Dropout(dropout))

    def forward(self, x):
        """x [L, B, C], contiguous; returns the same layout."""
        steps, _, channels = x.shape
        up, _, down, drop = self.temporal
        series = x.view(steps, -1).t()  # [B * C, L]
        mixed = F.linear(F.linear(series, up.weight, up.bias).relu_(), down.weight, down.bias)
        x = add_dropout(x, mixed.t().view_as(x), drop.p, self.training, batch_dim=1)

        up, _, down, drop = self.channel
        rows = x.view(-1, channels)  # [L * B, C]
        if runs_blocked(rows):
            mixed = _ChannelMLP.apply(rows, up.weight, up.bias, down.weight, down.bias)
        else:
            mixed = F.linear(F.linear(rows, up.weight, up.bias).relu_(), down.weight, down.bias)
        return add_dropout(x, mixed.view_as(x), drop.p, self.training, batch_dim=1)


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
        for block in self.model:
            x = block(x)
        steps, batch, channels = x.shape
        out = self.projection(x.view(steps, -1).t())  # [B * C, pred_len]
        out = out.view(batch, channels, -1).transpose(1, 2)  # [B, pred_len, C]
        return self.normalize.denorm(out) if self.normalize is not None else out


class _ChannelMLP(torch.autograd.Function):
    """relu(x @ w1.T + b1) @ w2.T + b2 for x [R, C] with C and the output width small (channels) and the
    hidden width wide (d_model): the [R, d_model] hidden layer is the only large tensor of TSMixer.

    Autograd would write it, its ReLU and their gradients to memory as four [R, d_model] tensors and read
    them back some ten times. Here it lives only in cache-sized blocks of rows, in two buffers reused
    block after block: forward keeps no hidden layer, and backward recomputes each block (a product with
    an inner dimension of C + 1, cheap) just before using it. The bias rides along as a column of ones
    beside x: no pass to broadcast it into the hidden layer, and its gradient comes out of the weight
    gradient's product instead of another pass over the hidden layer's gradient. Same mathematics, with
    the sums in another order.
    """

    @staticmethod
    def _blocks(rows: int, width: int):
        block = max(1, (1 << 17) // width)  # 128k floats: a hidden block and its gradient stay in L2
        return [(start, min(start + block, rows)) for start in range(0, rows, block)]

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        x1 = torch.cat([x, x.new_ones(x.shape[0], 1)], 1)  # [R, C + 1]
        w1b1 = torch.cat([w1, b1.unsqueeze(1)], 1)  # [d_model, C + 1]
        out = x.new_empty(x.shape[0], w2.shape[0])
        blocks = _ChannelMLP._blocks(x.shape[0], w1.shape[0])
        # one buffer for every block: fresh memory is paid for in page faults on first touch
        hidden_buffer = x.new_empty(blocks[0][1], w1.shape[0])
        for start, end in blocks:
            hidden = torch.mm(x1[start:end], w1b1.t(), out=hidden_buffer[:end - start]).relu_()
            torch.addmm(b2, hidden, w2.t(), out=out[start:end])
        ctx.save_for_backward(x1, w1b1, w2)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x1, w1b1, w2 = ctx.saved_tensors
        grad_x1, grad_w1b1, grad_w2 = torch.empty_like(x1), torch.zeros_like(w1b1), torch.zeros_like(w2)
        blocks = _ChannelMLP._blocks(x1.shape[0], w1b1.shape[0])
        hidden_buffer = x1.new_empty(blocks[0][1], w1b1.shape[0])
        grad_buffer = torch.empty_like(hidden_buffer)
        for start, end in blocks:
            rows, grad = x1[start:end], grad_out[start:end]
            hidden = torch.mm(rows, w1b1.t(), out=hidden_buffer[:end - start]).relu_()
            grad_w2.addmm_(grad.t(), hidden)
            grad_hidden = torch.mm(grad, w2, out=grad_buffer[:end - start])
            # ReLU's backward (the op autograd runs), in place
            torch.ops.aten.threshold_backward.grad_input(grad_hidden, hidden, 0, grad_input=grad_hidden)
            grad_w1b1.addmm_(grad_hidden.t(), rows)
            if ctx.needs_input_grad[0]:
                torch.mm(grad_hidden, w1b1, out=grad_x1[start:end])
        channels = x1.shape[1] - 1
        grad_x = grad_x1[:, :channels] if ctx.needs_input_grad[0] else None
        return grad_x, grad_w1b1[:, :channels], grad_w1b1[:, channels], grad_w2, grad_out.sum(0)
