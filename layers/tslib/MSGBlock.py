"""MSGNet's blocks (Cai et al., "MSGNet: Learning Multi-Scale Inter-Series Correlations for Multivariate
Time Series Forecasting", AAAI 2024) under TSLib's module, class and argument names: an adaptive graph
convolution (mix-hop propagation over a learned adjacency, after MTGNN), causal multi-head attention,
a small ViT and the output projection.
"""
import torch
import torch.nn.functional as F
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn, Tensor

# TSLib's MSGBlock defines FullAttention again; here it is the one of SelfAttention_Family, same function
from layers.tslib.SelfAttention_Family import FullAttention  # noqa: F401 (also TSLib's name in this module)


class Predict(nn.Module):
    """Linear map seq_len -> pred_len of x [B, c_out, seq_len], shared or one per channel."""

    def __init__(self, individual, c_out, seq_len, pred_len, dropout):
        super().__init__()
        self.individual = individual
        self.c_out = c_out
        if individual:
            self.seq2pred = nn.ModuleList(nn.Linear(seq_len, pred_len) for _ in range(c_out))
            self.dropout = nn.ModuleList(nn.Dropout(dropout) for _ in range(c_out))
        else:
            self.seq2pred = nn.Linear(seq_len, pred_len)
            self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        if not self.individual:
            return self.dropout(self.seq2pred(x))
        return torch.stack([self.dropout[i](self.seq2pred[i](x[:, i])) for i in range(self.c_out)], dim=1)


class Attention_Block(nn.Module):
    """Post-norm Transformer block: causal self-attention and a 1x1-convolution feed-forward."""

    def __init__(self, d_model, d_ff=None, n_heads=8, dropout=0.1, activation="relu"):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.attention = self_attention(FullAttention, d_model, n_heads=n_heads)
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x, attn_mask=None):
        new_x, _ = self.attention(x, x, x, attn_mask=attn_mask)
        x = self.norm1(x + self.dropout(new_x))
        y = self.dropout(self.activation(self.conv1(x.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm2(x + y)


class self_attention(nn.Module):
    """Query/key/value/output projections around `attention(attention_dropout=0.1)`."""

    def __init__(self, attention, d_model, n_heads):
        super().__init__()
        d_keys = d_values = d_model // n_heads
        self.inner_attention = attention(attention_dropout=0.1)
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_values * n_heads)
        self.out_projection = nn.Linear(d_values * n_heads, d_model)
        self.n_heads = n_heads

    def forward(self, queries, keys, values, attn_mask=None):
        batch, length, source, heads = queries.shape[0], queries.shape[1], keys.shape[1], self.n_heads
        out, attn = self.inner_attention(self.query_projection(queries).view(batch, length, heads, -1),
                                         self.key_projection(keys).view(batch, source, heads, -1),
                                         self.value_projection(values).view(batch, source, heads, -1),
                                         attn_mask)
        return self.out_projection(out.view(batch, length, -1)), attn


class GraphBlock(nn.Module):
    """Adaptive graph convolution over the c_out variables of x [B, T, d_model], residual, LayerNorm."""

    def __init__(self, c_out, d_model, conv_channel, skip_channel, gcn_depth, dropout, propalpha, seq_len, node_dim):
        super().__init__()
        self.nodevec1 = nn.Parameter(torch.randn(c_out, node_dim), requires_grad=True)
        self.nodevec2 = nn.Parameter(torch.randn(node_dim, c_out), requires_grad=True)
        self.start_conv = nn.Conv2d(1, conv_channel, (d_model - c_out + 1, 1))
        self.gconv1 = mixprop(conv_channel, skip_channel, gcn_depth, dropout, propalpha)
        self.gelu = nn.GELU()
        self.end_conv = nn.Conv2d(skip_channel, seq_len, (1, seq_len))
        self.linear = nn.Linear(c_out, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):
        adjacency = F.softmax(F.relu(torch.mm(self.nodevec1, self.nodevec2)), dim=1)
        out = self.start_conv(x.unsqueeze(1).transpose(2, 3))
        out = self.gelu(self.gconv1(out, adjacency))
        out = self.linear(self.end_conv(out).squeeze(-1))
        return self.norm(x + out)


class nconv(nn.Module):
    """One propagation step: x [N, C, W, L] mixed over W by the adjacency A [V, W]."""

    def forward(self, x, A):
        return torch.einsum('ncwl,vw->ncvl', x, A).contiguous()


class linear(nn.Module):
    """A 1x1 Conv2d."""

    def __init__(self, c_in, c_out, bias=True):
        super().__init__()
        self.mlp = nn.Conv2d(c_in, c_out, kernel_size=(1, 1), padding=(0, 0), stride=(1, 1), bias=bias)

    def forward(self, x):
        return self.mlp(x)


class mixprop(nn.Module):
    """Mix-hop propagation (MTGNN): gdep steps h = alpha x + (1 - alpha) A h, all hops concatenated and
    mixed by a 1x1 convolution (the dropout rate is stored, unused, as in TSLib)."""

    def __init__(self, c_in, c_out, gdep, dropout, alpha):
        super().__init__()
        self.nconv = nconv()
        self.mlp = linear((gdep + 1) * c_in, c_out)
        self.gdep = gdep
        self.dropout = dropout
        self.alpha = alpha

    def forward(self, x, adj):
        adj = adj + torch.eye(adj.size(0), device=x.device)
        normalised = adj / adj.sum(1).view(-1, 1)
        h, hops = x, [x]
        for _ in range(self.gdep):
            h = self.alpha * x + (1 - self.alpha) * self.nconv(h, normalised)
            hops.append(h)
        return self.mlp(torch.cat(hops, dim=1))


class simpleVIT(nn.Module):
    """A small ViT over x [B, C, N, P]: a same-size convolution into emb_size channels, `depth`
    pre-norm attention + feed-forward layers on the N * P tokens, back to [B, emb_size, N, P]."""

    def __init__(self, in_channels, emb_size, patch_size=2, depth=1, num_heads=4, dropout=0.1, init_weight=True):
        super().__init__()
        self.emb_size = emb_size
        self.depth = depth
        self.to_patch = nn.Sequential(
            nn.Conv2d(in_channels, emb_size, 2 * patch_size + 1, padding=patch_size),
            Rearrange('b e (h) (w) -> b (h w) e'))
        self.layers = nn.ModuleList(
            nn.ModuleList([nn.LayerNorm(emb_size), MultiHeadAttention(emb_size, num_heads, dropout),
                           FeedForward(emb_size, emb_size)]) for _ in range(depth))
        if init_weight:
            self._initialize_weights()

    def _initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)

    def forward(self, x):
        batch, _, _, width = x.shape
        x = self.to_patch(x)
        for norm, attn, ff in self.layers:
            x = attn(norm(x)) + x
            x = ff(x) + x
        return x.transpose(1, 2).reshape(batch, self.emb_size, -1, width)


class MultiHeadAttention(nn.Module):
    """simpleVIT's attention: softmax weights divided by sqrt(emb_size) (after the softmax, as TSLib),
    dropout on the weights."""

    def __init__(self, emb_size, num_heads, dropout):
        super().__init__()
        self.emb_size = emb_size
        self.num_heads = num_heads
        self.keys = nn.Linear(emb_size, emb_size)
        self.queries = nn.Linear(emb_size, emb_size)
        self.values = nn.Linear(emb_size, emb_size)
        self.att_drop = nn.Dropout(dropout)
        self.projection = nn.Linear(emb_size, emb_size)

    def forward(self, x: Tensor, mask: Tensor = None) -> Tensor:
        heads = [rearrange(f(x), "b n (h d) -> b h n d", h=self.num_heads)
                 for f in (self.queries, self.keys, self.values)]
        energy = torch.einsum('bhqd,bhkd->bhqk', heads[0], heads[1])
        if mask is not None:  # True where attending is allowed
            energy = energy.masked_fill(~mask, torch.finfo(torch.float32).min)
        weights = self.att_drop(F.softmax(energy, dim=-1) / self.emb_size ** (1 / 2))
        out = rearrange(torch.einsum('bhal,bhlv->bhav', weights, heads[2]), "b h n d -> b n (h d)")
        return self.projection(out)


class FeedForward(nn.Module):
    """Pre-norm two-layer GELU MLP."""

    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden_dim), nn.GELU(),
                                 nn.Linear(hidden_dim, dim))

    def forward(self, x):
        return self.net(x)
