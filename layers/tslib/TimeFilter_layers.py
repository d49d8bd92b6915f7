"""TimeFilter's graph-filter backbone (Hu et al., "TimeFilter: Patch-Specific Spatial-Temporal Graph
Filtration for Time Series Forecasting", ICML 2025) under TSLib's module, class and argument names.

Patches of all variables form one graph; each patch keeps its strongest edges (a k-nearest filter), and a
mixture of three experts (same variable, same time, others) chosen by top-p routing decides which edge
kinds it keeps. The routing's training noise is drawn per window inside the experiment's keyed training
steps (layers/noise.py) and from the global generator otherwise, as TSLib draws it.
"""
import torch
import torch.nn.functional as F
from torch import nn

from layers import noise


def region_masks(L, n_vars, device=None, dtype=torch.float32):
    """[L, 3, L] masks of patch k's spatial (same time, other variables), temporal (same variable) and
    other neighbours, for L patches = n_vars variables x (L // n_vars) steps."""
    steps = L // n_vars
    index = torch.arange(L, device=device)
    rows = index.view(-1, 1)
    spatial = (index % steps == rows % steps) & (index != rows)
    temporal = (index >= rows // steps * steps) & (index < rows // steps * steps + steps)
    spatial, temporal = spatial.to(dtype), temporal.to(dtype)
    return torch.stack([spatial, temporal, 1 - spatial - temporal], dim=1)


class GCN(nn.Module):
    """Graph convolution with a row-normalised (L1) adjacency per head."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.n_heads = n_heads

    def forward(self, adj, x):
        batch, length, _ = x.shape
        x = self.proj(x).view(batch, length, self.n_heads, -1)
        x = torch.einsum("bhij,bjhd->bihd", F.normalize(adj, p=1, dim=-1), x).contiguous()
        return x.view(batch, length, -1)


def mask_topk_moe(adj, thre, n_vars, masks):
    """Ablation: each region's edges kept above its own threshold thre [B, H, L, 3]."""
    if masks is None:
        masks = region_masks(adj.shape[-1], n_vars, adj.device)
    out = 0
    for region in range(3):
        part = adj * masks[:, region, :]
        part[part <= thre[:, :, :, region].unsqueeze(-1)] = 0
        out = out + part
    return out


def mask_topk_area(adj, n_vars, masks, alpha=0.5):
    """Ablation: each region keeps its top alpha share of edges."""
    L = adj.shape[-1]
    if masks is None:
        masks = region_masks(L, n_vars, adj.device)
    sizes = (n_vars - 1, L // n_vars - 1)
    sizes = sizes + (L - sizes[0] - sizes[1] - 1,)
    out = 0
    for region, n in enumerate(sizes):
        part = adj * masks[:, region, :]
        threshold = torch.sort(part, dim=-1, descending=True)[0][:, :, :, int(n * alpha)]
        out = out + part * (part >= threshold.unsqueeze(-1))
    return out


class mask_moe(nn.Module):
    """Top-p routing of each patch over the three edge regions (noisy gating in training)."""

    def __init__(self, n_vars, top_p=0.5, num_experts=3, in_dim=96):
        super().__init__()
        self.num_experts = num_experts
        self.n_vars = n_vars
        self.in_dim = in_dim
        self.gate = nn.Linear(self.in_dim, num_experts, bias=False)
        self.noise = nn.Linear(self.in_dim, num_experts, bias=False)
        self.noisy_gating = 1
        self.softplus = nn.Softplus()
        self.softmax = nn.Softmax(2)
        self.top_p = top_p

    def cv_squared(self, x):
        """Squared coefficient of variation (0 for one value)."""
        if x.shape[0] == 1:
            return torch.tensor([0], device=x.device, dtype=x.dtype)
        return x.float().var() / (x.float().mean() ** 2 + 1e-10)

    def cross_entropy(self, x):
        """Mean entropy of the routing distributions."""
        if x.shape[0] == 1:
            return torch.tensor([0], device=x.device, dtype=x.dtype)
        return -torch.mul(x, torch.log(x + 1e-10)).sum(dim=1).mean()

    def _noise(self, like):
        if noise.keyed():  # rows are B * H, window-major: each window's heads from its own key
            return noise.randn(like.shape[0], *like.shape[1:], device=like.device, dtype=like.dtype)
        return torch.randn_like(like)

    def noisy_top_k_gating(self, x, is_training, noise_epsilon=1e-2):
        logits = self.gate(x)
        if self.noisy_gating and is_training:
            logits = logits + self._noise(logits) * (self.softplus(self.noise(x)) + noise_epsilon)
        logits = self.softmax(logits)
        loss_dynamic = self.cross_entropy(logits)
        sorted_probs, sorted_indices = torch.sort(logits, descending=True)
        past = torch.cumsum(sorted_probs, dim=-1) > self.top_p
        # the expert that crosses top_p is kept: drop only those after it
        crossing = F.one_hot(past.long().argmax(dim=-1), num_classes=sorted_indices.size(-1)).bool()
        dropped = past & ~crossing
        top_p_mask = torch.zeros_like(dropped).scatter(-1, sorted_indices, ~dropped)
        loss_importance = self.cv_squared(torch.where(dropped, 0.0, sorted_probs).sum(0))
        return top_p_mask, loss_importance + 0.1 * loss_dynamic

    def forward(self, x, masks=None):
        batch, heads, L, _ = x.shape
        mask_base = torch.eye(L, device=x.device, dtype=torch.float32).view(1, 1, L, L)
        if self.top_p == 0.0:
            return mask_base, 0.0
        gates, loss = self.noisy_top_k_gating(x.reshape(batch * heads, L, L), self.training)
        gates = gates.reshape(batch, heads, L, -1).float()
        if masks is None:
            masks = region_masks(L, self.n_vars, x.device)
        return torch.einsum('bhli,lid->bhld', gates, masks) + mask_base, loss


def mask_topk(x, alpha=0.5, largest=False):
    """1 except at each row's int(alpha * L) smallest (largest=False) entries, which are 0."""
    _, indices = torch.topk(x, int(alpha * x.shape[-1]), dim=-1, largest=largest)
    return torch.ones_like(x, dtype=torch.float32).scatter_(-1, indices, 0)


class GraphLearner(nn.Module):
    """Adjacency [B, H, L, L] of patch features x [B, H, L, D]: GELU of projected dot products, the
    weakest alpha share of each row dropped, then the routed region mask."""

    def __init__(self, dim, n_vars, top_p=0.5, in_dim=96):
        super().__init__()
        self.dim = dim
        self.proj_1 = nn.Linear(dim, dim)
        self.proj_2 = nn.Linear(dim, dim)
        self.n_vars = n_vars
        self.mask_moe = mask_moe(n_vars, top_p=top_p, in_dim=in_dim)

    def forward(self, x, masks=None, alpha=0.5):
        adj = F.gelu(torch.einsum('bhid,bhjd->bhij', self.proj_1(x), self.proj_2(x)))
        adj = adj * mask_topk(adj, alpha)
        mask, loss = self.mask_moe(adj, masks)
        return adj * mask, loss


class GraphFilter(nn.Module):
    """Learned graph, softmax over neighbours, dropout on the weights, graph convolution."""

    def __init__(self, dim, n_vars, n_heads=4, scale=None, top_p=0.5, dropout=0., in_dim=96):
        super().__init__()
        self.dim = dim
        self.n_heads = n_heads
        self.scale = dim ** (-0.5) if scale is None else scale
        self.dropout = nn.Dropout(dropout)
        self.graph_learner = GraphLearner(self.dim // self.n_heads, n_vars, top_p, in_dim=in_dim)
        self.graph_conv = GCN(self.dim, self.n_heads)

    def forward(self, x, masks=None, alpha=0.5):
        batch, length, _ = x.shape
        heads = x.reshape(batch, length, self.n_heads, -1).permute(0, 2, 1, 3)
        adj, loss = self.graph_learner(heads, masks, alpha)
        return self.graph_conv(self.dropout(torch.softmax(adj, dim=-1)), x), loss


class GraphBlock(nn.Module):
    """Pre-norm graph filter and feed-forward, each residual; returns (x, routing loss)."""

    def __init__(self, dim, n_vars, d_ff=None, n_heads=4, top_p=0.5, dropout=0., in_dim=96):
        super().__init__()
        self.dim = dim
        self.d_ff = dim * 4 if d_ff is None else d_ff
        self.gnn = GraphFilter(self.dim, n_vars, n_heads, top_p=top_p, dropout=dropout, in_dim=in_dim)
        self.norm1 = nn.LayerNorm(self.dim)
        self.ffn = nn.Sequential(nn.Linear(self.dim, self.d_ff), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(self.d_ff, self.dim))
        self.norm2 = nn.LayerNorm(self.dim)

    def forward(self, x, masks=None, alpha=0.5):
        out, loss = self.gnn(self.norm1(x), masks, alpha)
        x = x + out
        return x + self.ffn(self.norm2(x)), loss


class TimeFilter_Backbone(nn.Module):
    """n_blocks graph blocks; returns (x, mean routing loss)."""

    def __init__(self, hidden_dim, n_vars, d_ff=None, n_heads=4, n_blocks=3, top_p=0.5, dropout=0., in_dim=96):
        super().__init__()
        self.dim = hidden_dim
        self.d_ff = self.dim * 2 if d_ff is None else d_ff
        self.blocks = nn.ModuleList(GraphBlock(self.dim, n_vars, self.d_ff, n_heads, top_p, dropout, in_dim)
                                    for _ in range(n_blocks))
        self.n_blocks = n_blocks

    def forward(self, x, masks=None, alpha=0.5):
        moe_loss = 0.0
        for block in self.blocks:
            x, loss = block(x, masks, alpha)
            moe_loss += loss
        return x, moe_loss / self.n_blocks
