"""Per-rank memory of fine-tuning, on paper: every release built at its largest released shape on the meta device
(no weights read, nothing allocated) with its parameter count, and the memory one rank holds under DDP, ZeRO,
FSDP2 and LoRA at 1, 8 and 64 ranks for 100M, 500M, 1B and 2.5B parameters.

    python -m benchmarks.memory_table            # print the tables
    python -m benchmarks.memory_table --write    # store them as benchmarks/results/memory_table.{json,csv} + the page

The arithmetic is in `per_rank` (bytes per parameter by mode and precision), `activation_bytes` (a pre-norm
transformer's tensors saved for backward, checked against `measured_activation_bytes`, which counts them with
torch.autograd.graph.saved_tensors_hooks) and `lora_trainable` (2 * r * (d_in + d_out) summed over the adapted
Linear layers); tests/test_memory_table.py checks them by hand-computed cases."""
import argparse
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

GiB = 2 ** 30
RESULTS = Path(__file__).resolve().parent / "results"
NAME = "memory_table"

# ------------------------------------------------------------ the releases at their largest released shape
def releases():
    """[(--model, checkpoint, run.py size arguments, published size, where the sizes come from)]: each release
    folder's LARGEST_SHAPES (its adapter.py), in the registry's order. A folder builds its released architecture
    from these arguments when no --pretrain_model_path is given (its README's "Without --pretrain_model_path")."""
    from models.foundation import adapter_modules

    return [(module.ADAPTERS[0].model, *shape) for module in adapter_modules()
            for shape in getattr(module, "LARGEST_SHAPES", ())]


# The Linear layers LoRA adapts by default here: attention (query, key, value, output) and MLP projections, by
# their module names in the releases (routers, embeddings, heads and flow-matching heads are left out).
LORA_TARGETS = (
    r"(attention|attn|self_attention|self_attn|SelfAttention|EncDecAttention)\."
    r"(q|k|v|o|query|key|value|out|q_proj|k_proj|v_proj|o_proj|out_proj|qkv_proj)$",
    r"(mlp|ffn|ffn_layer|DenseReluDense|experts\.\d+|shared)\."
    r"(wi|wo|fc1|fc2|fc_gate|up|down|gate|gate_proj|up_proj|down_proj|proj_up|proj_down|proj_up_gate)$",
    r"stacked_xf\.\d+\.(ff0|ff1)$",
)


def build_on_meta(model, sizes, seq_len=512, pred_len=96):
    """The model `model` built with run.py's size arguments `sizes` ({name: value}) on the meta device: shapes,
    no storage."""
    from models import get_model_class
    from utils.arguments import parse_args

    argv = [f"--{name}={value}" for name, value in sizes.items()]
    args = parse_args(["--model", model, *argv, "--seq_len", str(seq_len), "--pred_len", str(pred_len)])
    with torch.device("meta"):
        return get_model_class(model)(args)


def parameter_count(module):
    return sum(p.numel() for p in module.parameters())


def adapted_linears(module, patterns=LORA_TARGETS):
    """[(name, Linear)] of `module` whose names match one of `patterns` (re.search)."""
    compiled = [re.compile(p) for p in patterns]
    return [(name, layer) for name, layer in module.named_modules()
            if isinstance(layer, nn.Linear) and any(p.search(name) for p in compiled)]


def lora_trainable(module, rank, patterns=LORA_TARGETS):
    """LoRA's trainable parameters: A (r x d_in) and B (d_out x r) for each adapted Linear."""
    return sum(rank * (layer.in_features + layer.out_features) for _, layer in adapted_linears(module, patterns))


# ------------------------------------------------------------ the generic shapes and the arithmetic
@dataclass(frozen=True)
class Shape:
    """A pre-norm transformer: `layers` blocks of attention (q, k, v, o: 4 d^2) and an MLP of 4d (8 d^2),
    12 d^2 parameters a block; embeddings and heads left out (a patch embedding is small)."""
    d_model: int
    layers: int
    heads: int

    @property
    def block_params(self):
        return 12 * self.d_model ** 2

    @property
    def params(self):
        return self.block_params * self.layers

    def lora_params(self, rank):
        """2 r (d_in + d_out) summed: q, k, v, o (d -> d) and the MLP's d -> 4d, 4d -> d: 18 r d a block."""
        return self.layers * rank * (4 * 2 * self.d_model + 2 * 5 * self.d_model)


SIZES = {"100M": (100e6, Shape(768, 14, 12)), "500M": (500e6, Shape(1536, 18, 16)),
         "1B": (1e9, Shape(2048, 20, 16)), "2.5B": (2.5e9, Shape(2560, 32, 20))}
RANKS = (1, 8, 64)
MODES = ("DDP", "ZeRO", "FSDP2", "LoRA")


@dataclass(frozen=True)
class Setting:
    batch: int = 8          # sequences per rank (a micro-batch)
    seq: int = 512          # tokens a sequence (an 8192-step context in patches of 16)
    lora_rank: int = 16
    prefetch: int = 2       # FSDP2 blocks unsharded at once: the one computing and the next, prefetched


def activation_bytes(shape, setting, bytes_per=4):
    """Tensors a pre-norm block saves for backward with fused (flash / memory-efficient) attention, per token:
    the block input, LayerNorm 1's output, q, k and v, the attention output, the residual sum, LayerNorm 2's
    output, the MLP's hidden before and after its activation (4d each): 16 d; plus both LayerNorms' mean and
    rstd (4) and attention's logsumexp (one per head). No dropout masks; every layer's kept (no checkpointing)."""
    per_token = 16 * shape.d_model + 4 + shape.heads
    return bytes_per * setting.batch * setting.seq * per_token * shape.layers


def checkpointed_activation_bytes(shape, setting, bytes_per=4):
    """With activation checkpointing per block: each block's input kept, one block's tensors recomputed."""
    one = Shape(shape.d_model, 1, shape.heads)
    return bytes_per * setting.batch * setting.seq * shape.d_model * shape.layers + activation_bytes(one, setting,
                                                                                                      bytes_per)


def per_rank(mode, params, ranks, shape, setting=Setting(), precision="fp32"):
    """{part: bytes} one rank holds. fp32: weights and gradients 4 bytes a parameter, Adam's two moments 8.
    bf16: 2-byte working weights and gradients beside fp32 master weights (4) and Adam (8); FSDP2 as its mixed
    precision policy keeps it: fp32 sharded parameters (the master), bf16 only for the gathered block, gradients
    reduced and kept sharded in fp32. DDP replicates everything; ZeRO shards the optimizer state (torch's
    ZeroRedundancyOptimizer: Adam's moments, and under bf16 the master weights, which the optimizer owns);
    FSDP2 shards parameters, gradients and optimizer state, and gathers `prefetch` blocks' full parameters (and
    one block's full gradients) at a time; LoRA keeps the base weights frozen and replicated (bf16: in bf16) and
    trains the adapters (see Shape.lora_params) replicated as DDP does."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {precision!r} is not fp32 or bf16")
    half = precision == "bf16"
    act_bytes = 2 if half else 4
    block = shape.block_params
    if mode == "LoRA":
        trainable = shape.lora_params(setting.lora_rank)
        weights = (2 if half else 4) * params + 4 * trainable
        grads = 4 * trainable
        optimizer = 8 * trainable
    elif mode == "FSDP2":
        weights = 4 * params / ranks + setting.prefetch * (2 if half else 4) * block
        grads = 4 * params / ranks + 4 * block
        optimizer = 8 * params / ranks
    else:
        master = 4 * params if half else 0
        weights = (2 if half else 4) * params
        grads = (2 if half else 4) * params
        optimizer = 8 * params + master
        if mode == "ZeRO":
            optimizer /= ranks
    activations = activation_bytes(shape, setting, act_bytes)
    checkpointed = checkpointed_activation_bytes(shape, setting, act_bytes)
    return {"weights": weights, "gradients": grads, "optimizer": optimizer, "activations": activations,
            "total": weights + grads + optimizer + activations,
            "total_checkpointed": weights + grads + optimizer + checkpointed}


# ------------------------------------------------------------ measured: what autograd keeps for backward
class Block(nn.Module):
    """The pre-norm block activation_bytes describes (GELU MLP of 4d, scaled_dot_product_attention)."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (proj(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for proj in (self.q, self.k,
                                                                                                 self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def measured_activation_bytes(module, *inputs):
    """Bytes of the distinct storages autograd saves for backward in one forward of `module` (its parameters
    not counted): a tensor saved by several operations (a LayerNorm's output read by q, k and v) once."""
    parameters = {p.untyped_storage()._cdata for p in module.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in parameters:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(*inputs)
    return sum(saved.values())


def measured_reference(shape, setting):
    """measured_activation_bytes of `shape`'s blocks on the CPU at `setting`'s batch and length (fused CPU
    attention, as on a GPU; the meta device takes the unfused path, which keeps the s x s scores)."""
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(shape.d_model, shape.heads) for _ in range(shape.layers)))
    x = torch.randn(setting.batch, setting.seq, shape.d_model, requires_grad=True)
    return measured_activation_bytes(model, x)


# ------------------------------------------------------------ the tables
def gib(value):
    return f"{value / GiB:.2f}"


@functools.lru_cache(maxsize=None)
def release_counts(rank=Setting().lora_rank):
    """{checkpoint: (parameters, LoRA's trainable parameters at `rank`, adapted Linears)} of releases(), each
    built on meta."""
    counts = {}
    for model, hub, sizes, _, _ in releases():
        built = build_on_meta(model, sizes)
        counts[hub] = (parameter_count(built), lora_trainable(built, rank), len(adapted_linears(built)))
    return counts


WINDOW = (512, 64)  # the window whose activations each release's row measures: steps in, steps out


def release_activations(window=WINDOW):
    """{checkpoint: bytes autograd saves for backward in one training forward of one window (`window`: steps in
    and out, one channel, run.py's default dropout) on the meta device, or None where the release cannot run on
    meta (it copies a value to the host)}."""
    found = {}
    for model, hub, sizes, _, _ in releases():
        built = build_on_meta(model, sizes, *window).train()
        with torch.device("meta"):
            window_values = torch.randn(1, window[0], 1)
        try:
            found[hub] = measured_activation_bytes(built, window_values)
        except NotImplementedError:  # "Cannot copy out of meta tensor": a value read on the host
            found[hub] = None
    return found


def release_table(measure=True):
    steps, ahead = WINDOW
    rows = [["release (`--model`)", "largest released checkpoint", "parameters (built on meta)", "published",
             f"LoRA r={Setting().lora_rank} trainable (adapted Linears)",
             *([f"activations of one window ({steps} -> {ahead} steps), MiB"] if measure else []), "shape from"]]
    counts = release_counts()
    saved = release_activations() if measure else {}
    for model, hub, _, published, source in releases():
        params, trainable, adapted = counts[hub]
        measured = [] if not measure else ["not on meta" if saved[hub] is None else f"{saved[hub] / 2 ** 20:.1f}"]
        rows.append([model, hub, f"{params:,}", published, f"{trainable:,} ({adapted})", *measured, source])
    return rows


def memory_rows(precision):
    setting = Setting()
    rows = [["size", "d_model x layers", "mode", "ranks", "weights", "gradients", "optimizer", "activations",
             "total", "total, checkpointed"]]
    for size, (params, shape) in SIZES.items():
        for mode in MODES:
            for ranks in RANKS:
                part = per_rank(mode, params, ranks, shape, setting, precision)
                rows.append([size, f"{shape.d_model} x {shape.layers}", mode, str(ranks),
                             *(gib(part[k]) for k in ("weights", "gradients", "optimizer", "activations", "total",
                                                      "total_checkpointed"))])
    return rows


def totals_rows():
    setting = Setting()
    rows = [["size", "mode", *(f"{p}, {n} rank{'s' * (n > 1)}" for p in ("fp32", "bf16") for n in RANKS)]]
    for size, (params, shape) in SIZES.items():
        for mode in MODES:
            rows.append([size, mode, *(gib(per_rank(mode, params, n, shape, setting, p)["total"])
                                       for p in ("fp32", "bf16") for n in RANKS)])
    return rows


def markdown_table(rows):
    return "\n".join(["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0]),
                      *("| " + " | ".join(row) + " |" for row in rows[1:])])


def document(measure=True):
    setting = Setting()
    check = ""
    if measure:
        shape = Shape(256, 2, 4)
        small = Setting(batch=2, seq=96)
        got, formula = measured_reference(shape, small), activation_bytes(shape, small)
        check = (f" Checked by measurement: the tensors saved for backward (torch.autograd.graph.saved_tensors_hooks, "
                 f"distinct storages) of {shape.layers} such blocks (d_model {shape.d_model}, {shape.heads} heads, "
                 f"batch {small.batch}, {small.seq} tokens, fp32, CPU) are {got:,} bytes; the formula gives "
                 f"{formula:,}.")
    lines = [
        "# Per-rank memory of fine-tuning, on paper",
        "",
        "Generated by `python -m benchmarks.memory_table --write`. Part 1: every release built at its largest "
        "released shape on the meta device (no weights read), its parameters counted. Part 2: the memory one rank "
        "holds, in GiB (2^30 bytes), for a model of each size.",
        "",
        "## The releases at their largest released shape",
        "",
        markdown_table(release_table(measure)),
        "",
        "The activations column: the distinct storages autograd saves for backward (saved_tensors_hooks) in one "
        "training forward of one single-channel window, run.py's default dropout (0.1), measured on the meta "
        "device, where attention takes the unfused path that keeps the attention scores (a GPU's fused kernels "
        "keep less); per token a release keeps more than the generic block below (two attentions a block, "
        "dropout masks, gated MLPs; Time-MoE: every step a token, and every expert on every token, as its model "
        "runs them off the CPU); \"not on "
        "meta\": the release reads a value back on the host. Multiply by the windows (times channels) a rank "
        "holds.",
        "",
        "LoRA's trainable count is 2 * r * (d_in + d_out) summed over the Linear layers whose names match the "
        "attention and MLP patterns of benchmarks/memory_table.py (LORA_TARGETS); an sLSTM release's recurrent "
        "cells are not Linear layers, so only its feed-forward projections count. The shapes are each release "
        "folder's LARGEST_SHAPES (models/foundation/<release>/adapter.py).",
        "",
        "## Assumptions",
        "",
        "- Parameters: the nominal count of the size (100M ... 2.5B); the shape (d_model x layers, a pre-norm "
        "transformer with an MLP of 4 d_model, 12 d_model^2 parameters a block, within 2 % of the nominal count) "
        "gives the activations, FSDP2's gathered block and LoRA's adapters.",
        "- Adam: two fp32 moments, 8 bytes a parameter. fp32: weights 4, gradients 4 bytes a parameter. bf16 "
        "mixed precision: bf16 working weights and gradients (2 + 2) and fp32 master weights (4) owned by the "
        "optimizer; under FSDP2 the fp32 sharded parameters are the master, bf16 only for the gathered block, "
        "gradients reduced and kept in fp32.",
        "- DDP: everything replicated. ZeRO (`--zero`, torch's ZeroRedundancyOptimizer): Adam's state (and the "
        "master weights under bf16) divided by the ranks; weights and gradients replicated. FSDP2 (`--fsdp`): "
        f"parameters, gradients and Adam's state divided by the ranks, plus {setting.prefetch} blocks' full "
        "parameters gathered at once (the one computing and the next, prefetched) and one block's full gradients "
        "before their reduce-scatter.",
        f"- LoRA: rank r = {setting.lora_rank} on q, k, v, o and both MLP projections (18 r d_model a block); "
        "base weights frozen and replicated (bf16: stored in bf16), no gradients or Adam state for them; the "
        "adapters, their gradients and Adam's state in fp32, replicated across ranks (DDP over the adapters). "
        "Activations as full fine-tuning's: the adapters read the inputs the base layers save anyway.",
        f"- Activations: a micro-batch of {setting.batch} sequences of {setting.seq} tokens per rank (the same at "
        "every rank count: the global batch grows with the ranks), fused attention (no seq x seq scores kept), "
        "no dropout masks: per layer bytes = bytes_per_value * batch * seq * (16 d_model + 4 + heads) (the block "
        "input, LayerNorm 1's output, q, k, v, attention output, residual sum, LayerNorm 2's output, the 4 d_model "
        "MLP hidden before and after its activation; LayerNorm means and rstd; attention's logsumexp), times the "
        "layers. `total, checkpointed`: activation checkpointing per block keeps each block's input "
        "(batch * seq * d_model a layer) plus one block's tensors." + check,
        "- Not counted: the CUDA context and allocator fragmentation (about 0.5-1 GiB a GPU), DDP's and ZeRO's "
        "communication buckets (25 MiB each), the data, and the logits / loss of the head.",
        "",
        "## Per rank, fp32, by part (GiB)",
        "",
        markdown_table(memory_rows("fp32")),
        "",
        "## Total per rank, fp32 and bf16 mixed precision (GiB)",
        "",
        markdown_table(totals_rows()),
        "",
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="store the tables as benchmarks/results/memory_table.json + CSV and rewrite the page")
    args = parser.parse_args(argv)
    text = document()
    print(text)
    if args.write:
        from benchmarks import results_page
        markdown = RESULTS / f"{NAME}.md"
        markdown.write_text(text)
        results_page.add(markdown, replace=True)
        results_page.main(["write"])
        print(f"stored as {RESULTS / NAME}.json and its CSV files; {results_page.PAGE} rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
