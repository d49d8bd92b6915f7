"""TiRex: NX-AI's pre-trained zero-shot forecaster (35M parameters), an xLSTM of sLSTM blocks over patches of
32 steps that forecasts the quantiles 0.1 ... 0.9 of the next patch; longer horizons come from masked
(NaN) patches appended to the context, never from its own forecasts fed back. Auer et al., "TiRex: Zero-Shot
Forecasting Across Long and Short Horizons with Enhanced In-Context Learning", NeurIPS 2025.

Builds on the tirex-ts package (an optional extra: pip install -e '.[tirex]'): the network is the package's
own tirex.models.tirex.TiRexZero (its patch tokenizer and instance scaling, residual patch embeddings, sLSTM
blocks, RMSNorm, quantile head), and a forecast is its `_forecast_tensor`, the function behind
`load_model(...).forecast(...)`, step for step (Model.forecast): context cut to or NaN-padded in front to the
model's train_ctx_len (2048 released), every rollout step one more NaN patch, each step a full pass. One
difference, for speed: the patches of padding that every series has (61 of 64 at seq_len 96) are one input, so
they run once, and every series continues from the states they leave (in evaluation kept per number of padding
patches, so once a run); the forecasts are the package's (the tests and crosscheck.py hold them to it). On CUDA,
in evaluation, the sLSTM recurrence is replayed from a CUDA graph of the package's loop (GraphedRecurrence). Why the package and not a native
copy: it installs beside torch 2.13 and pandas 3 (torch, numpy, scikit-learn, huggingface-hub), builds a model
offline from a config, and its modules are plain nn.Modules, differentiable, so DDP wraps and fine-tunes it.
On a CPU only its `torch` backend exists (the `cuda` one needs NX-AI's xlstm kernels): the sLSTM recurrence
then runs as the package runs it, in bfloat16 with float32 gate arithmetic, for every forecast (zero-shot,
validation, test). In training it runs the package's same recurrence (`slstm_forward`) in float32: the bfloat16
cast of the recurrent kernel rounds its gradient to bfloat16 on each process before DDP sums them, which made
1 x 8 and 2 x 4 windows train apart by 5e-4 of the gradient norm (float32: float rounding). The package has no
dropout, so --dropout is not read (fine-tuning is world-size exact without keyed masks). One more thing for
exactness: the input gate's bias is a direction the loss does not depend on (a constant shift of the exponential
input gate moves the stabilizer m by the same amount, so i, f, c and n are unchanged), so its true gradient is 0
and its computed one rounding noise, which Adam scales up to learning-rate-sized steps that differ between world
sizes (1e-4 apart after 2 steps at lr 1e-3); its gradient is set to that 0.

All channels of a batch are one call: [B, seq_len, C] -> B*C univariate series -> [B, pred_len, C, 9].

Shapes: with --pretrain_model_path DIR (the folder of NX-AI/TiRex, its model.ckpt), the model is the one
model.ckpt's hyper_parameters describe; without it, the released architecture with --d_model (embedding_dim),
--n_heads (num_heads), --e_layers (num_blocks) and --d_ff (input_ff_dim) in place of the released sizes, patch
32 and train_ctx_len 2048 as released (adapter.RELEASED). A --seq_len past train_ctx_len (the package
would silently drop the oldest steps) or a --pred_len past it (the last rollout step would see no data) is
refused."""
import functools
import math
import os
import types

import torch
from torch import nn

from models.foundation.tirex import adapter as release
from utils.errors import UserError
from utils.optional import require_package

tirex_models = require_package("tirex.models.tirex", "tirex-ts", "tirex", "TiRex")
slstm_forward = require_package("tirex.models.slstm.cell", "tirex-ts", "tirex", "TiRex").sLSTMCellTorch.slstm_forward

BACKEND = "torch"  # the package's pure-PyTorch sLSTM: the only one on a CPU (the CUDA kernels need xlstm)
# The package leaves the sLSTM's recurrent kernel, bias and gate projections as torch.empty (it only ever loads
# them); a model built without the release draws them as xLSTM's small_init: N(0, sqrt(2 / (5 d))).
SMALL_INIT = 2.0 / 5.0
# The shared NaN prefix runs as a batch of one, and the series after it as fewer tokens than the package's whole
# windows: a GEMM with fewer than 5 rows sums in another order here (measured, x86 CPU), and a last-bit difference
# can round the bfloat16 sLSTM state the other way, so with fewer than this many prefix patches or rows every
# series runs whole, as in the package.
SHARED_MIN = 8


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    quantile_levels = release.RELEASED["quantiles"]
    checkpoint_adapters = (release.TIREX,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        shape = self.shape_of(configs)
        if shape["quantiles"] != self.quantile_levels:
            raise ValueError(f"the release forecasts the quantiles {shape['quantiles']}, not TiRex's "
                             f"{self.quantile_levels}")
        if shape["patch_size"] != shape["output_patch_size"]:
            raise ValueError("TiRexZero needs equal input and output patch sizes")
        if shape["embedding_dim"] % shape["num_heads"]:
            raise ValueError(f"d_model {shape['embedding_dim']} is not divisible by n_heads {shape['num_heads']}")
        context = shape["train_ctx_len"]
        if configs.seq_len > context:
            raise ValueError(f"TiRex reads at most {context} steps of context (its train_ctx_len); --seq_len "
                             f"{configs.seq_len} would lose the oldest {configs.seq_len - context} unread: use "
                             f"--seq_len {context} or less")
        if configs.pred_len > context:
            raise ValueError(f"TiRex rolls a horizon out as NaN patches inside its {context}-step window, so "
                             f"--pred_len {configs.pred_len} would leave its last steps no data: use --pred_len "
                             f"{context} or less")
        model_config = {"input_patch_size": shape["patch_size"], "output_patch_size": shape["patch_size"],
                        "quantiles": list(shape["quantiles"]), "input_ff_dim": shape["input_ff_dim"],
                        "block_kwargs": {**shape.get("block_kwargs", {}), "embedding_dim": shape["embedding_dim"],
                                         "num_heads": shape["num_heads"], "num_blocks": shape["num_blocks"]}}
        self.tirex = tirex_models.TiRexZero(BACKEND, model_config, train_ctx_len=context)
        self.register_buffer(release.CONTEXT_KEY, torch.tensor(context))  # written back by an export
        self.pred_len = configs.pred_len
        self._prefix_weights, self._prefix_cache = None, {}  # prefix_states' (not state: derived from the weights)
        self._init_empty_parameters(shape["embedding_dim"])
        recurrence = GraphedRecurrence()
        for block in self.tirex.blocks:
            cell = block.slstm_layer.slstm_cell
            cell._impl_torch = types.MethodType(_recurrence, cell)  # an instance's own: the package's class is untouched
            cell._impl_forward_torch = recurrence  # the package's slstm_forward; on CUDA in evaluation a graph of it
            cell._bias_.register_hook(functools.partial(_without_input_gate, cell.config.num_heads, cell.config.num_gates))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Weights for another context length would load (the buffer is a scalar) and run at this one: refused."""
        theirs, ours = state_dict.get(prefix + release.CONTEXT_KEY), int(getattr(self, release.CONTEXT_KEY))
        if theirs is not None and int(theirs) != ours:
            raise UserError(f"these TiRex weights read {int(theirs)} steps of context (train_ctx_len) and this model "
                            f"{ours}: build it from the release they came from (--pretrain_model_path)")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def shape_of(configs):
        """The architecture: the release's hyper_parameters (--pretrain_model_path a folder or model.ckpt), or the
        released one with the generic size arguments."""
        path = getattr(configs, "pretrain_model_path", None)
        if path and (os.path.isdir(path) or str(path).endswith(".ckpt") or not os.path.exists(path)):
            _, hyper = release.read_release(path)
            return release.architecture(hyper, release.released_file(path))
        return {**release.RELEASED, "output_patch_size": release.RELEASED["patch_size"],
                "embedding_dim": configs.d_model, "num_heads": configs.n_heads, "num_blocks": configs.e_layers,
                "input_ff_dim": configs.d_ff}

    def _init_empty_parameters(self, embedding_dim):
        std = math.sqrt(SMALL_INIT / embedding_dim)
        for name, parameter in self.tirex.named_parameters():
            if name.endswith(("_recurrent_kernel_", "gate.weight")):
                nn.init.normal_(parameter, std=std)
            elif name.endswith("_bias_"):
                nn.init.zeros_(parameter)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, length, channels = x_enc.shape
        series = x_enc.permute(0, 2, 1).reshape(batch * channels, length)
        dtype = self.tirex.out_norm.weight.dtype
        if dtype == torch.float32:
            quantiles = self.forecast(series)  # [B*C, Q, pred_len]
        else:  # the package computes in float32 (it casts the context): a lower-precision copy runs autocast
            with torch.autocast(x_enc.device.type, dtype=dtype):
                quantiles = self.forecast(series)
        quantiles = quantiles.reshape(batch, channels, -1, self.pred_len).permute(0, 3, 1, 2)
        return quantiles.to(x_enc.dtype)  # [B, pred_len, C, Q]

    def forecast(self, context):
        """The package's TiRexZero._forecast_tensor(context, pred_len), step for step: each rollout step appends
        one NaN patch to the context and forecasts the next patch from the whole window, NaN-padded in front (or
        cut) to train_ctx_len. [N, L] -> [N, Q, pred_len]."""
        patch = self.tirex.tokenizer.patch_size
        context = context.to(torch.float32)
        steps = []
        for step in range(-(-self.pred_len // patch)):
            if step:
                context = torch.cat([context, torch.full_like(context[:, :patch], float("nan"))], dim=1)
            steps.append(self.next_patch(context))
        return torch.cat(steps, dim=-1)[..., :self.pred_len]

    def next_patch(self, context):
        """TiRexZero._forecast_single_step, one difference: the leading patches that are NaN padding in every
        series (seq_len 96 of 2048: 61 of the 64) are one input, the same for all series, so they run once, as a
        batch of one, and every series continues from the sLSTM states they leave ([N, Q, patch])."""
        tirex = self.tirex
        length = tirex.config.train_ctx_len
        context, padding = tirex._adjust_context_length(context, length, length)
        tokens, scaling = tirex.tokenizer.input_transform(context)  # [N, T, patch], each series z-scored
        present = torch.isnan(tokens).logical_not().to(tokens.dtype)
        tokens = torch.cat((torch.nan_to_num(tokens, nan=tirex.config.nan_mask_value), present), dim=2)
        shared = padding // tirex.tokenizer.patch_size
        if shared < SHARED_MIN or tokens.shape[0] * (tokens.shape[1] - shared) < SHARED_MIN:
            shared = 0  # too few rows for a GEMM to sum as it does for the whole batch: every series whole
        hidden = tirex.input_patch_embedding(tokens[:, shared:])
        states = self.prefix_states(tokens[:1, :shared]) if shared else [None] * len(tirex.blocks)
        for block, state in zip(tirex.blocks, states):
            hidden, _ = _block(block, hidden, None if state is None else state.expand(-1, hidden.shape[0], -1))
        last = tirex.output_patch_embedding(tirex.out_norm(hidden[:, -1:]))  # [N, 1, Q * patch]
        last = last.unflatten(-1, (len(tirex.config.quantiles), tirex.tokenizer.patch_size)).transpose(1, 2)
        return tirex.tokenizer.output_transform(last.to(tokens), scaling)  # [N, Q, patch], scaled back

    def prefix_states(self, padding):
        """Each block's sLSTM state [4, 1, H] after `padding` [1, k, 2 * patch], k patches of NaN padding (all
        zeros: value and presence). They depend on k and the weights alone, so in evaluation (no gradient) they are
        kept per k and run once for all batches and roll-out steps, as long as no weight changes (a weight's
        version or storage is part of the key)."""
        tirex = self.tirex
        key = None
        if not torch.is_grad_enabled():
            device = padding.device.type
            autocast = (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
                        and torch.get_autocast_dtype(device))
            weights = tuple((p.data_ptr(), p._version) for p in self.parameters())
            made = (weights, self.training, padding.device, padding.dtype, autocast)  # training: float32 recurrence
            if self._prefix_weights != made:
                self._prefix_weights, self._prefix_cache = made, {}
            key = padding.shape[1]
            if key in self._prefix_cache:
                return self._prefix_cache[key]
        prefix, states = tirex.input_patch_embedding(padding), []
        for block in tirex.blocks:
            prefix, state = _block(block, prefix, None)
            states.append(state)
        if key is not None:
            self._prefix_cache[key] = states
        return states

def _block(block, x, state):
    """sLSTMBlock.forward of the package with the sLSTM's state in and out (its sLSTMLayer takes a state but returns
    none): the same modules in the same order; tests/test_tirex.py holds it to block(x)."""
    layer = block.slstm_layer
    normed = block.norm_slstm(x)
    gates = torch.cat((layer.fgate(normed), layer.igate(normed), layer.zgate(normed), layer.ogate(normed)), dim=-1)
    y, state = layer.slstm_cell(gates, state=state)
    x = x + layer.group_norm(y).transpose(1, 2).view(x.shape[0], x.shape[1], -1)
    return x + block.ffn(block.norm_ffn(x)), state


def _without_input_gate(heads, gates, grad):
    """The gradient of an sLSTM cell's _bias_ ([heads, gates, head_dim] flat; gate 0 the input gate, as the
    package's _impl_torch reads it) with the input gate's entries at their exact value, 0."""
    grad = grad.clone().view(heads, gates, -1)
    grad[:, 0] = 0
    return grad.view(-1)


def _recurrence(cell, input, state):
    """sLSTMCell._impl_torch of `cell`: the package's own (bfloat16) in eval mode; in training the same
    recurrence, the package's slstm_forward, on float32 tensors, so that the recurrent kernel's gradient is
    summed over the batch and the processes in float32 (see the module docstring)."""
    if not cell.training:
        return type(cell)._impl_torch(cell, input, state)
    heads, gates, head_dim = cell.config.num_heads, cell.config.num_gates, cell.config.head_dim
    bias = cell._bias_.float().reshape(heads, gates, head_dim).permute(1, 0, 2).reshape(-1)  # gate-major, as there
    return cell._impl_forward_torch(input.reshape(input.shape[0], input.shape[1], -1).float(), state.float(),
                                    cell._recurrent_kernel_.float(), bias)


class GraphedRecurrence:
    """The package's sLSTM recurrence (sLSTMCellTorch.slstm_forward: [S, B, 4H] gate inputs, [4, B, H] states,
    recurrent kernel, bias -> all steps' outputs and the last states), a Python loop of some 30 small ops per step.
    On CUDA without gradients it is captured once per shape as a CUDA graph and replayed: one launch instead of
    S * 30, the same kernels on the same shapes, so the same numbers. Anywhere else (CPU, training, a gradient
    wanted) it is the package's function as it is."""
    LIMIT = 64  # graphs kept (one per distinct input shape); past it all are dropped and captured again

    def __init__(self):
        self.graphs, self.pool = {}, None

    def __call__(self, x, states, kernel, bias):
        if x.device.type != "cuda" or torch.is_grad_enabled() or torch.cuda.is_current_stream_capturing():
            return slstm_forward(x, states, kernel, bias)
        # inference mode in the key: its static buffers would refuse the in-place copies outside it
        key = (torch.is_inference_mode_enabled(), *((t.shape, t.stride(), t.dtype, t.device)
                                                    for t in (x, states, kernel, bias)))
        if key not in self.graphs:
            if len(self.graphs) >= self.LIMIT:
                self.graphs.clear()
            self.graphs[key] = self.capture(x, states, kernel, bias)
        inputs, outputs, graph = self.graphs[key]
        for static, value in zip(inputs, (x, states, kernel, bias)):
            static.copy_(value)
        graph.replay()
        # Cloned at once: the graphs share one memory pool, so another graph's replay may overwrite these buffers.
        return tuple(out.clone() for out in outputs)

    def capture(self, *arguments):
        inputs = tuple(t.clone() for t in arguments)  # the graph's own, outside its pool
        side, current = torch.cuda.Stream(inputs[0].device), torch.cuda.current_stream(inputs[0].device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            slstm_forward(*inputs)  # a warm-up outside the capture, as CUDA graphs require
        current.wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = slstm_forward(*inputs)
        return inputs, outputs, graph
