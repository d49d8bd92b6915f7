"""Time-MoE: a decoder-only transformer over single time points with sparse mixture-of-experts feed-forward layers
and several output heads, each forecasting the next 1, 8, 32 or 64 steps of every token. Shi et al., "Time-MoE:
Billion-Scale Time Series Foundation Models with Mixture of Experts", ICLR 2025; weights Maple728/TimeMoE-50M and
Maple728/TimeMoE-200M (adapter.py reads and writes them).

Native: written here in plain torch from the paper, the released config.json files and Time-MoE's own code
(time_moe/models/modeling_time_moe.py and ts_generation_mixin.py, read as facts), because that code exists only
as `trust_remote_code` on the hub and runs on transformers 4.40 alone. What it computes:

- each time point is a token: embedding silu(gate(x)) * value(x), both Linear(1, hidden) without bias;
- layers of pre-norm (RMSNorm, float32 statistics) causal attention with rotary positions over the whole head
  (rotate-half, base rope_theta), biased q/k/v and bias-free output projections, then pre-norm sparse experts:
  softmax over the router's logits, the top-k experts' SwiGLU outputs (intermediate_size / k wide) weighted by
  their (unrenormalised) probabilities, plus a shared SwiGLU expert (intermediate_size wide) gated by
  sigmoid(shared_gate(x)); a final RMSNorm and one linear head per horizon length (the experts' dispatch is
  chosen by device: SparseExperts.grouped on the CPU, SparseExperts.dense elsewhere);
- forecasting is the reference `generate`: the last token's head output is appended to the sequence and the
  model runs on (a key/value cache keeps what it has seen); each step uses the longest head not longer than the
  steps still wanted (scanning horizon_lengths in order, stopping at the first longer one; the first head, cut,
  when even it is longer), so 96 steps are a 64-step head then a 32-step one;
- input scaling (--use_norm 1, the default): each series is standardised by its context's mean and standard
  deviation (unbiased, as Time-MoE's README does before generate; a zero deviation counts as 1) and the forecast
  scaled back. --use_norm 0 feeds the experiment's data as it is, as Time-MoE's run_eval.py does with its
  StandardScaler-scaled benchmark data.

Training (`computes_loss`): given the window's future, each series x_enc ++ target (scaled as above) is a
sequence whose every token predicts its next steps with every head; the loss is the Huber loss (delta 2) of each
head over the steps inside the sequence, averaged over heads, as TimeMoeForPrediction computes it with its loss
masks; plus router_aux_loss_factor times the load-balancing loss of the forward call (Switch-Transformer style,
over every layer's router logits of every token of the call), added to every window's loss. The balancing term
is a function of the whole micro-batch, as in the reference (per batch), so 1 x (2 accumulation steps of 4)
trains as 2 processes x 4 do, while 1 x 8 differs from 2 x 4 by it (tests/test_time_moe.py).

Exactness across evaluation batch sizes: a CPU matrix product of fewer than 12 rows (or of one output column)
sums a row in another order than the same row inside a larger one, the experts see a number of tokens that depends
on the batch, ATen computes exp-like functions on the loop's tail elements by a scalar formula that rounds otherwise,
and its fused attention sums a short query in a batch-dependent order on several threads. So every projection pads
such small inputs to 12 rows and computes one-column outputs as a product and sum, SiLU / sigmoid / rsqrt run on
whole vectors, and the new tokens of a rolled-out step attend to the cache through matrix products: a series'
forecast does not depend on what else is in the batch (tests/test_time_moe.py, 1 and 2 threads).

Shapes: with --pretrain_model_path a released folder every size comes from its config.json; without one, the
released architecture with --d_model, --d_ff, --e_layers, --n_heads and --dropout (the attention dropout) in place
of the released sizes. A --seq_len + --pred_len beyond max_position_embeddings (4096 released, the longest
context Time-MoE was trained on) is refused.

The attention weights' dropout runs through layers.dropout.attention: a dropout that follows the sample (keyed
by the window, so fine-tuning is the same on any number of processes), where the fused kernel's dropout_p would
draw from each process's generator."""
import torch
import torch.nn.functional as F
from torch import nn

from layers.dropout import attention as dropout_attention
from models.foundation.time_moe import adapter as release
from utils.errors import UserError

MIN_ROWS = 12  # below this many rows a CPU GEMM may sum a row in another order (measured: 1-3, 5-7, 9-11)
VECTOR = 64  # elements: a multiple of the step of every CPU vector loop (2 x 16 floats with AVX-512)
HUBER_DELTA = 2.0  # TimeMoeForPrediction.loss_function


def elementwise(function, x):
    """function(x) for an elementwise function whose vectorised and scalar (loop tail) paths round differently
    (exp, sigmoid, rsqrt): x flattened and padded to a multiple of VECTOR elements, so that every element takes
    the vectorised path whatever the number of rows. Widths that are multiples of VECTOR (released: 384, 768,
    768, 1536, ...) need no padding and get none."""
    count = x.numel()
    if count % VECTOR == 0:
        return function(x)
    return function(F.pad(x.reshape(-1), (0, -count % VECTOR)))[:count].view_as(x)


class Linear(nn.Linear):
    """nn.Linear whose output rows do not depend on how many rows it is given (module docstring)."""

    def forward(self, x):
        if self.out_features == 1:  # a one-column GEMM (gemv) sums rows by their position: product and sum instead
            out = (x * self.weight[0]).sum(-1, keepdim=True)
            return out if self.bias is None else out + self.bias
        rows = x.numel() // x.shape[-1]
        if rows >= MIN_ROWS:
            return F.linear(x, self.weight, self.bias)
        padded = F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, MIN_ROWS - rows))
        return F.linear(padded, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], self.out_features)


class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * elementwise(torch.rsqrt, x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, width, inner):
        super().__init__()
        self.gate, self.up, self.down = Linear(width, inner, bias=False), Linear(width, inner, bias=False), \
            Linear(inner, width, bias=False)

    def forward(self, x):
        return self.down(elementwise(F.silu, self.gate(x)) * self.up(x))


def rotary_table(length, dim, base, device):
    """(cos, sin) [length, dim] of rotary positions 0 .. length-1, computed as the reference computes its cache."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    freqs = torch.outer(torch.arange(length, device=device).float(), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def cached_attention(q, k, v, mask):
    """Softmax attention of a few new queries to the cache, as matrix products: PyTorch's CPU
    scaled_dot_product_attention sums a short query's scores in an order that depends on the batch when it
    runs on several threads (the reference, too, multiplies and takes the softmax itself)."""
    scores = torch.matmul(q, k.transpose(2, 3)) / q.shape[-1] ** 0.5
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


class Attention(nn.Module):
    def __init__(self, width, heads, kv_heads, dropout):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.query = Linear(width, heads * self.head_dim)
        self.key = Linear(width, kv_heads * self.head_dim)
        self.value = Linear(width, kv_heads * self.head_dim)
        self.out = Linear(heads * self.head_dim, width, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, cos, sin, cache=None):
        """x [N, T, width], rotary (cos, sin) of its T positions; `cache` (keys, values) of the positions before.
        Returns the output and the (keys, values) of every position so far."""
        n, steps, _ = x.shape
        q = self.query(x).view(n, steps, self.heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(n, steps, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(n, steps, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        keys, values = k, v
        if self.kv_heads != self.heads:  # grouped queries: query head h reads key/value head h // groups
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        if k.shape[2] == steps:
            out = dropout_attention(q, k, v, self.dropout, is_causal=True)
        else:  # new tokens after cached ones: token t sees every cached position and the new ones up to itself
            seen = k.shape[2] - steps
            mask = torch.arange(k.shape[2], device=x.device) <= seen + torch.arange(steps, device=x.device)[:, None]
            out = cached_attention(q, k, v, mask) if not self.training else \
                dropout_attention(q, k, v, self.dropout, attn_mask=mask)
        return self.out(out.transpose(1, 2).reshape(n, steps, -1)), (keys, values)


class SparseExperts(nn.Module):
    def __init__(self, width, inner, experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.router = Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(width, inner // top_k) for _ in range(experts))
        self.shared = SwiGLU(width, inner)
        self.shared_gate = Linear(width, 1, bias=False)

    def forward(self, x):
        """x [tokens, width] -> (output [tokens, width], router logits [tokens, experts])."""
        logits = self.router(x)
        weights, chosen = torch.topk(F.softmax(logits, dim=1, dtype=torch.float), self.top_k, dim=-1)
        chosen, order = chosen.sort(dim=-1)  # each token's experts in expert order: the order the reference adds them
        weights = weights.gather(1, order).to(x.dtype)
        grouped = x.device.type == "cpu" and not torch.compiler.is_compiling()
        out = self.grouped(x, chosen, weights) if grouped else self.dense(x, chosen, weights)
        return out + elementwise(torch.sigmoid, self.shared_gate(x)) * self.shared(x), logits

    def grouped(self, x, chosen, weights):
        """Each expert on the rows that chose it: the experts' row counts are read on the host to split the rows,
        free on the CPU (where this runs), a device-to-host read and a graph break elsewhere."""
        weights = weights.reshape(-1)
        pairs = torch.argsort(chosen.reshape(-1), stable=True)  # the (token, slot) pairs, grouped by expert
        counts = torch.bincount(chosen.reshape(-1), minlength=len(self.experts)).tolist()
        # every expert runs, one no token chose on no rows (as in the reference): each parameter takes part in every
        # forward, which DDP without find_unused_parameters needs (its gradient is then 0)
        routed = torch.cat([expert(rows) for expert, rows in zip(self.experts, x[pairs // self.top_k].split(counts))])
        routed = (routed * weights[pairs, None])[torch.argsort(pairs)].view(x.shape[0], self.top_k, -1)
        out = routed[:, 0]
        for slot in range(1, self.top_k):  # gathers instead of the reference's index_add_ (a slow scatter on the CPU)
            out = out + routed[:, slot]
        return out

    def dense(self, x, chosen, weights):
        """Every expert on every row, its output kept where the row chose it: nothing read on the host, shapes
        fixed (so one graph under torch.compile), experts / top_k times the experts' arithmetic of `grouped`. A
        row's expert outputs, their products with the weights and their sum in expert order are `grouped`'s, so the
        forecasts are its bits where a projection's rows do not depend on how many it is given (the CPU here)."""
        # [tokens, experts, 1] each: the weight a row gives each expert (its slot's, copied), whether it chose it
        gates = x.new_zeros(x.shape[0], len(self.experts)).scatter(1, chosen, weights).unsqueeze(-1)
        picked = chosen.new_zeros(gates.shape[:2], dtype=torch.bool).scatter(1, chosen, True).unsqueeze(-1)
        out = None
        for expert, gate, hit in zip(self.experts, gates.unbind(1), picked.unbind(1)):
            term = torch.where(hit, expert(x) * gate, 0)  # where, not the product by 0: an unchosen inf stays out
            out = term if out is None else out + term  # + 0 where the row did not choose it: exact
        return out


class DenseFFN(SwiGLU):
    def forward(self, x):
        return super().forward(x), None


class DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        width, eps = config["hidden_size"], config["rms_norm_eps"]
        self.attention_norm = RMSNorm(width, eps)
        self.attention = Attention(width, config["num_attention_heads"], config["num_key_value_heads"],
                                   config["attention_dropout"])
        self.ffn_norm = RMSNorm(width, eps)
        if config["use_dense"]:
            self.mlp = DenseFFN(width, config["intermediate_size"])
        else:
            self.moe = SparseExperts(width, config["intermediate_size"], config["num_experts"],
                                     config["num_experts_per_tok"])

    def forward(self, x, cos, sin, cache=None):
        attended, cache = self.attention(self.attention_norm(x), cos, sin, cache)
        x = x + attended
        ffn = self.mlp if hasattr(self, "mlp") else self.moe
        out, logits = ffn(self.ffn_norm(x).reshape(-1, x.shape[-1]))
        return x + out.view_as(x), cache, logits


class Embedding(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.value, self.gate = Linear(1, width, bias=False), Linear(1, width, bias=False)

    def forward(self, x):
        x = x.unsqueeze(-1)
        return elementwise(F.silu, self.gate(x)) * self.value(x)


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    computes_loss = True
    checkpoint_adapters = (release.TIME_MOE,)
    # the series as given with --use_norm 1 (the README's path standardises each window itself); --use_norm 0 is
    # run_eval.py's protocol, whose model reads the data standardised by the training split (--scale's)
    series_as_given = staticmethod(lambda configs: bool(getattr(configs, "use_norm", 1)))

    def __init__(self, configs):
        super().__init__()
        path = getattr(configs, "pretrain_model_path", None)
        config = release.folder_config(path) if path else None
        where = "config.json of " + str(path) if config else "the released configuration"
        config = config or release.generic_config(configs)
        check_shape(config, configs.seq_len, configs.pred_len, where)
        self.config = config
        self.pred_len, self.use_norm = configs.pred_len, bool(getattr(configs, "use_norm", 1))
        self.horizons = list(config["horizon_lengths"])
        self.embedding = Embedding(config["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config["num_hidden_layers"]))
        self.norm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])
        self.heads = nn.ModuleList(Linear(config["hidden_size"], h, bias=False) for h in self.horizons)
        self.register_buffer(release.FIELDS_KEY, release.fields_tensor(config))
        for module in self.modules():  # the reference's _init_weights: N(0, 0.02), zero biases
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Weights whose config.json fields no shape shows (heads, top-k, rotary base ...) differ from this model's
        would load and compute something else: refused in one line."""
        theirs = state_dict.get(prefix + release.FIELDS_KEY)
        if theirs is not None and not torch.equal(theirs.cpu(), getattr(self, release.FIELDS_KEY).cpu()):
            mine, other = release.fields_of(getattr(self, release.FIELDS_KEY).cpu()), release.fields_of(theirs.cpu())
            differ = ", ".join(f"{k} {other[k]} (this model {mine[k]})" for k in release.FIELDS if other[k] != mine[k])
            raise UserError(f"these Time-MoE weights were made with {differ}: build the model from the folder they "
                            "came from (--pretrain_model_path) or with the same arguments")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None, target=None):
        batch, length, channels = x_enc.shape
        # window-major (window b's channels together), and contiguous: with one window the reshape is a strided
        # view, whose mean and deviation would be summed in another order than a batch's
        series = x_enc.permute(0, 2, 1).reshape(batch * channels, length).contiguous()
        mean, scale = self.scaling(series)
        if target is not None:
            future = target.permute(0, 2, 1).reshape(batch * channels, -1).contiguous()
            return self.training_loss(torch.cat(((series - mean) / scale, (future - mean) / scale), dim=1), batch)
        forecast = self.generate((series - mean) / scale) * scale + mean
        return forecast.view(batch, channels, -1).permute(0, 2, 1)

    def scaling(self, series):
        """(mean, standard deviation) of each series' context, or (0, 1) with --use_norm 0."""
        if not self.use_norm:
            return series.new_zeros(series.shape[0], 1), series.new_ones(series.shape[0], 1)
        std = series.std(dim=1, keepdim=True)
        return series.mean(dim=1, keepdim=True), torch.where(std > 0, std, torch.ones_like(std))

    def decode(self, tokens, start=0, caches=None):
        """The decoder over `tokens` [N, T] at positions start ... start+T-1 after the cached ones: (hidden
        states [N, T, width] before the final norm, every layer's router logits)."""
        head_dim = self.config["hidden_size"] // self.config["num_attention_heads"]
        cos, sin = rotary_table(start + tokens.shape[1], head_dim, self.config["rope_theta"], tokens.device)
        cos, sin = cos[start:].to(tokens.dtype), sin[start:].to(tokens.dtype)
        x = self.embedding(tokens)
        logits = []
        for index, layer in enumerate(self.layers):
            x, cache, layer_logits = layer(x, cos, sin, None if caches is None else caches[index])
            if caches is not None:
                caches[index] = cache
            logits.append(layer_logits)
        return x, logits

    def head_for(self, remaining):
        """The output head the reference's generate uses with `remaining` steps still wanted."""
        chosen = 0
        for index, horizon in enumerate(self.horizons[1:], start=1):
            if horizon > remaining:
                break
            chosen = index
        return chosen

    def generate(self, context):
        """[N, L] -> [N, pred_len]: the reference generate's greedy rollout, a key/value cache kept."""
        caches, pieces, tokens, start, remaining = [None] * len(self.layers), [], context, 0, self.pred_len
        while remaining > 0:
            hidden, _ = self.decode(tokens, start, caches)
            step = self.heads[self.head_for(remaining)](self.norm(hidden[:, -1]))[:, :remaining]
            pieces.append(step)
            start, tokens, remaining = start + tokens.shape[1], step, remaining - step.shape[1]
        return torch.cat(pieces, dim=1)

    def training_loss(self, sequence, batch):
        """Each window's loss [B] over its series `sequence` [B*C, L+P] (module docstring)."""
        inputs, labels = sequence[:, :-1], sequence[:, 1:]
        hidden, logits = self.decode(inputs)
        hidden = self.norm(hidden)
        steps = inputs.shape[1]
        loss = 0
        for head, horizon in zip(self.heads, self.horizons):
            # position t forecasts labels t .. t+horizon-1; those past the sequence's end are not scored
            wanted = F.pad(labels, (0, horizon - 1)).unfold(1, horizon, 1)  # [N, T, horizon]
            inside = F.pad(labels.new_ones(steps), (0, horizon - 1)).unfold(0, horizon, 1)  # [T, horizon]
            errors = F.huber_loss(head(hidden), wanted, reduction="none", delta=HUBER_DELTA) * inside
            loss = loss + errors.sum(dim=(1, 2)) / inside.sum()
        per_window = (loss / len(self.horizons)).view(batch, -1).mean(dim=1)
        if self.config["apply_aux_loss"] and not self.config["use_dense"]:
            per_window = per_window + self.config["router_aux_loss_factor"] * self.balance(logits)
        return per_window

    def balance(self, logits):
        """The load-balancing loss of one forward call (the reference's load_balancing_loss_func without a mask):
        experts x sum over top-k slots and experts of (share of tokens routed there) x (mean router probability)."""
        experts = self.config["num_experts"]
        probabilities = F.softmax(torch.cat(logits, dim=0), dim=-1)
        _, chosen = torch.topk(probabilities, self.config["num_experts_per_tok"], dim=-1)
        routed = F.one_hot(chosen, experts).float().mean(dim=0)  # [top_k, experts]
        return (routed * probabilities.mean(dim=0)).sum() * experts


def check_shape(config, seq_len, pred_len, where):
    """A ValueError for a configuration this model cannot build or a context and horizon it cannot serve."""
    if config["input_size"] != 1:
        raise ValueError(f"{where}: input_size {config['input_size']}; Time-MoE is built here for univariate "
                         "series (input_size 1, as released)")
    if config["hidden_act"] != "silu":
        raise ValueError(f"{where}: hidden_act {config['hidden_act']}; Time-MoE's layers use silu")
    if config["hidden_size"] % config["num_attention_heads"] or \
            config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ValueError(f"{where}: hidden_size {config['hidden_size']} must divide into num_attention_heads "
                         f"{config['num_attention_heads']}, and those into num_key_value_heads "
                         f"{config['num_key_value_heads']}")
    if not config["use_dense"] and not 1 <= config["num_experts_per_tok"] <= config["num_experts"]:
        raise ValueError(f"{where}: num_experts_per_tok {config['num_experts_per_tok']} of {config['num_experts']} "
                         "experts")
    longest = config["max_position_embeddings"]
    if seq_len + pred_len > longest:
        raise ValueError(f"Time-MoE reads at most {longest} positions (max_position_embeddings of {where}) and "
                         f"--seq_len {seq_len} + --pred_len {pred_len} needs {seq_len + pred_len}: shorten the "
                         "context or the horizon")
