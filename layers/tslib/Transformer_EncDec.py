"""TSLib's Transformer encoder and decoder under its names, signatures and state_dict keys
(Time-Series-Library, layers/Transformer_EncDec.py): post-norm blocks (Vaswani et al., NeurIPS 2017) around
an AttentionLayer (layers/SelfAttention_Family.py), and Informer's distilling ConvLayer (Zhou et al.,
AAAI 2021). The feed-forward keeps TSLib's kernel-size-1 Conv1d parameters (conv1, conv2) and applies
them as the linear maps they are (F.linear on the squeezed kernel: no transposes, the same function).
"""
import torch.nn.functional as F
from torch import nn


class ConvLayer(nn.Module):
    """Informer's distilling: circular conv, BatchNorm, ELU, stride-2 max pool; [B, L, C] -> [B, ~L/2, C]."""

    def __init__(self, c_in):
        super().__init__()
        self.downConv = nn.Conv1d(in_channels=c_in, out_channels=c_in, kernel_size=3, padding=2,
                                  padding_mode='circular')
        self.norm = nn.BatchNorm1d(c_in)
        self.activation = nn.ELU()
        self.maxPool = nn.MaxPool1d(kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        x = self.activation(self.norm(self.downConv(x.transpose(1, 2))))
        return self.maxPool(x).transpose(1, 2)


def _activation(name):
    return F.relu if name == "relu" else F.gelu  # TSLib: anything but "relu" is GELU


def _pointwise(conv, x):
    """A kernel-size-1 Conv1d over time applied to x [B, L, C] as the linear map it is."""
    return F.linear(x, conv.weight.squeeze(-1), conv.bias)


class _FeedForward(nn.Module):
    """Shared by the encoder and decoder layers: x + FFN(x), FFN = conv2(dropout(act(conv1(x)))), dropped."""

    def _feed_forward(self, x):
        y = self.dropout(self.activation(_pointwise(self.conv1, x)))
        return x + self.dropout(_pointwise(self.conv2, y))


class EncoderLayer(_FeedForward):
    """x = norm1(x + attention(x)); out = norm2(x + FFN(x)). Returns (out, attention weights or None)."""

    def __init__(self, attention, d_model, d_ff=None, dropout=0.1, activation="relu"):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.attention = attention
        self.conv1 = nn.Conv1d(in_channels=d_model, out_channels=d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(in_channels=d_ff, out_channels=d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, x, attn_mask=None, tau=None, delta=None):
        new_x, attn = self.attention(x, x, x, attn_mask=attn_mask, tau=tau, delta=delta)
        x = self.norm1(x + self.dropout(new_x))
        return self.norm2(self._feed_forward(x)), attn


class Encoder(nn.Module):
    """Encoder layers (with Informer's ConvLayer between them when given; delta reaches only the first),
    then an optional norm. Returns (x, the layers' attention weights)."""

    def __init__(self, attn_layers, conv_layers=None, norm_layer=None):
        super().__init__()
        self.attn_layers = nn.ModuleList(attn_layers)
        self.conv_layers = nn.ModuleList(conv_layers) if conv_layers is not None else None
        self.norm = norm_layer

    def forward(self, x, attn_mask=None, tau=None, delta=None):
        attns = []
        if self.conv_layers is not None:
            for i, (attn_layer, conv_layer) in enumerate(zip(self.attn_layers, self.conv_layers)):
                x, attn = attn_layer(x, attn_mask=attn_mask, tau=tau, delta=delta if i == 0 else None)
                x = conv_layer(x)
                attns.append(attn)
            x, attn = self.attn_layers[-1](x, tau=tau, delta=None)
            attns.append(attn)
        else:
            for attn_layer in self.attn_layers:
                x, attn = attn_layer(x, attn_mask=attn_mask, tau=tau, delta=delta)
                attns.append(attn)
        if self.norm is not None:
            x = self.norm(x)
        return x, attns


class DecoderLayer(_FeedForward):
    """Self-attention (masked by x_mask), cross-attention to the encoder output, feed-forward; post-norm."""

    def __init__(self, self_attention, cross_attention, d_model, d_ff=None, dropout=0.1, activation="relu"):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.self_attention = self_attention
        self.cross_attention = cross_attention
        self.conv1 = nn.Conv1d(in_channels=d_model, out_channels=d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(in_channels=d_ff, out_channels=d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, x, cross, x_mask=None, cross_mask=None, tau=None, delta=None):
        x = self.norm1(x + self.dropout(self.self_attention(x, x, x, attn_mask=x_mask, tau=tau, delta=None)[0]))
        x = self.norm2(x + self.dropout(self.cross_attention(x, cross, cross, attn_mask=cross_mask, tau=tau,
                                                             delta=delta)[0]))
        return self.norm3(self._feed_forward(x))


class Decoder(nn.Module):
    """Decoder layers, then an optional norm and an optional projection."""

    def __init__(self, layers, norm_layer=None, projection=None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm_layer
        self.projection = projection

    def forward(self, x, cross, x_mask=None, cross_mask=None, tau=None, delta=None):
        for layer in self.layers:
            x = layer(x, cross, x_mask=x_mask, cross_mask=cross_mask, tau=tau, delta=delta)
        if self.norm is not None:
            x = self.norm(x)
        if self.projection is not None:
            x = self.projection(x)
        return x
