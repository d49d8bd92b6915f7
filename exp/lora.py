"""LoRA fine-tuning through peft (the `lora` extra): --lora_rank > 0 injects low-rank adapters into a model's
nn.Linear modules that --lora_targets names, and freezes everything else.

Exp_Basic applies it once, after the pre-trained weights are in and before layers.dropout keys every nn.Dropout:
peft's adapter dropout is an nn.Dropout, so it is keyed by the sample like every other (the same global batch
trains the same adapters on any number of processes).

--lora_targets are shell-style patterns (fnmatch) matched against an nn.Linear's last name (`q`) or its
qualified name (`encoder.block.0.layer.0.SelfAttention.q`). Left out, DEFAULT_TARGETS' names are taken, and a
model that has none of them (TSMixer: linear maps only) adapts every nn.Linear; a model that reaches none of its
adapters in a forward (DLinear computes with its layers' weights) is refused at its first. Modules that see the
samples in their second dimension (time_first(): patterns the release folders declare) are left out of the default.

A LoRA model's state dict (checkpoint.pth, last.pth's weights) holds the adapters, the buffers, the sha256 of the
base weights and --lora_alpha, not the frozen base weights: a load takes those from the model, built on the base
it names by hash (--adaptation --pretrain_model_path), and refuses any other. `merged_state` merges the adapters
into a base's weights (peft's merge), for `python -m exp.export export --base`.
"""
import fnmatch
import functools
import hashlib
import re

import torch

from utils.errors import UserError, require

# The attention and MLP projections of each family, by the last part of their module names.
DEFAULT_TARGETS = {
    "T5 (the Chronos family)": ("q", "k", "v", "o", "wi", "wo", "wi_0", "wi_1"),
    "TSLib's AttentionLayer (TimerXL, TimeXer)": ("query_projection", "key_projection", "value_projection",
                                                  "out_projection"),
    "this zoo's attention and feed-forward (PatchTST, iTransformer, Transformer, Timer)": (
        "query", "key", "value", "out", "linear1", "linear2"),
    "Llama-style attention and gated MLPs": ("q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj",
                                             "up_proj", "down_proj", "gate", "up", "down", "fc1", "fc2", "fc_gate"),
    "a fused qkv projection with ff0 / ff1": ("qkv_proj", "ff0", "ff1"),
    "xLSTM feed-forward": ("proj_up_gate", "proj_up", "proj_down"),
}
DEFAULT_NAMES = tuple(dict.fromkeys(name for names in DEFAULT_TARGETS.values() for name in names))


def linear_names(model):
    """The qualified names of `model`'s nn.Linear modules, in module order."""
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and name]


def _matches(name, pattern):
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name.rsplit(".", 1)[-1], pattern)


def target_modules(model, patterns, model_name="the model"):
    """The qualified names of the nn.Linear modules `patterns` (a list; empty for the default) choose, or the
    run's one line when a pattern matches none."""
    linears = linear_names(model)
    require(linears, f"--lora_rank: model {model_name} has no nn.Linear module to adapt; fine-tune it without "
                     "--lora_rank")
    if not patterns:
        chosen = [name for name in linears if any(_matches(name, p) for p in DEFAULT_NAMES) and not _time_first(name)]
        return chosen or [name for name in linears if not _time_first(name)]
    unmatched = [p for p in patterns if not any(_matches(name, p) for name in linears)]
    if unmatched:
        last = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in linears))
        shown = ", ".join(last[:12]) + (f" and {len(last) - 12} more" if len(last) > 12 else "")
        raise UserError(f"--lora_targets {' '.join(unmatched)} matches no nn.Linear module of model {model_name}; "
                        f"name some of its modules ({shown}), or leave --lora_targets out for its attention and "
                        "MLP projections")
    return [name for name in linears if any(_matches(name, p) for p in patterns)]


@functools.cache
def time_first():
    """Patterns of the modules that see the samples in their second dimension ([time, series, d], as an attention
    across the series of a group does), each release folder's LORA_TIME_FIRST: the adapters' dropout keys the first
    dimension, so they are left out of the default, and naming them with --lora_dropout > 0 is refused."""
    from models.foundation import lora_time_first

    return lora_time_first()


def _time_first(name):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in time_first())


def _peft():
    try:
        import peft
    except ModuleNotFoundError:
        raise UserError("--lora_rank needs the peft package: pip install peft (or this package's [lora] extra)") \
            from None
    return peft


def apply_lora(model, args):
    """`model` with LoRA adapters of --lora_rank, --lora_alpha and --lora_dropout on --lora_targets' modules,
    only the adapters trainable (peft's inject_adapter_in_model, in place). A run without --lora_rank: `model`."""
    if not args.lora_rank:
        return model
    peft = _peft()
    targets = target_modules(model, list(args.lora_targets or ()), args.model)
    time_first = [name for name in targets if _time_first(name)]
    if time_first and args.lora_dropout:
        more = f" and {len(time_first) - 1} more" if len(time_first) > 1 else ""
        raise UserError(f"--lora_dropout {args.lora_dropout} on {time_first[0]}{more}: these modules see the series "
                        "time-first, where the adapters' dropout cannot follow the sample; leave them out of "
                        "--lora_targets, or use --lora_dropout 0")
    config = peft.LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                             target_modules=targets, bias="none")
    base = base_weights_hash(model)
    model = peft.inject_adapter_in_model(config, model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(is_adapter(name))
    # what a checkpoint of the model (checkpoint.pth, last.pth) holds beside the adapters: the identity of their base
    # and the scale they were trained at; the frozen base weights stay out of it and come from the model on a load,
    # which refuses a checkpoint of other base weights wherever it is loaded (a resume, an evaluation)
    model.register_buffer(BASE_KEY, torch.frombuffer(bytearray(bytes.fromhex(base)), dtype=torch.uint8))
    model.register_buffer(ALPHA_KEY, torch.tensor(float(args.lora_alpha), dtype=torch.float64))
    model._lora_hooks = (model.register_state_dict_post_hook(_without_base),
                         model.register_load_state_dict_pre_hook(_base_from_the_model))
    _refuse_unreached_adapters(model, peft, args.model)
    return model


def _refuse_unreached_adapters(model, peft, model_name):
    """One line at the model's first forward if it reached none of its LoRA layers (a model that computes with its
    nn.Linear modules' weights, not through them, never sees their adapters); the hooks go after that forward."""
    reached, handles = [], []

    def mark(*_):
        reached.append(True)

    def check(*_):
        for handle in handles:
            handle.remove()
        if not reached:
            raise UserError(f"--lora_rank: model {model_name} computes its forecast from its nn.Linear modules' "
                            "weights, not through the modules, so their LoRA adapters would change nothing; fine-tune "
                            "it without --lora_rank")

    handles.extend(layer.register_forward_pre_hook(mark) for layer in model.modules()
                   if isinstance(layer, peft.tuners.lora.LoraLayer))
    handles.append(model.register_forward_hook(check))


BASE_KEY = "lora_base_sha256"
ALPHA_KEY = "lora_alpha"
LORA_KEYS = (BASE_KEY, ALPHA_KEY)
HASH_CHUNK = 1 << 22  # elements widened at a time


def base_weights_hash(weights):
    """sha256 of a model's state dict (or of a state dict): every name, shape and value, by name. Floating values
    are hashed as float32 (float64 ones as they are), so a base read from a bf16 file into an fp32 model has the
    identity of the file's weights. The base weights' identity, computed once, before the adapters."""
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name].detach().cpu().contiguous().reshape(-1)
        widened = torch.float64 if value.dtype == torch.float64 else torch.float32
        floating = value.is_floating_point()
        digest.update(f"{name}:{widened if floating else value.dtype}:{tuple(state[name].shape)};".encode())
        for start in range(0, value.numel(), HASH_CHUNK):
            chunk = value[start:start + HASH_CHUNK]
            digest.update((chunk.to(widened) if floating else chunk).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def _hex(buffer):
    return bytes(buffer.cpu().tolist()).hex()


def _without_base(module, state_dict, prefix, *_):
    for name, _parameter in module.named_parameters(remove_duplicate=False):
        if not is_adapter(name):
            state_dict.pop(prefix + name, None)


def _base_from_the_model(module, state_dict, prefix, *_):
    saved, own = state_dict.get(prefix + BASE_KEY), getattr(module, BASE_KEY)
    if saved is None:
        return  # a missing key is the strict load's to name
    if not torch.equal(saved.cpu(), own.cpu()):
        raise UserError(f"the checkpoint's LoRA adapters were trained on other base weights (sha256 "
                        f"{_hex(saved)[:12]}..., these {_hex(own)[:12]}...); load it on the weights it was fine-tuned "
                        "from: the same --pretrain_model_path with --adaptation")
    alpha, own_alpha = state_dict.get(prefix + ALPHA_KEY), getattr(module, ALPHA_KEY)
    if alpha is not None and float(alpha) != float(own_alpha):
        raise UserError(f"the checkpoint's LoRA adapters were trained with --lora_alpha {float(alpha):g}, not "
                        f"{float(own_alpha):g}; load it with --lora_alpha {float(alpha):g}")
    for name, parameter in module.named_parameters(remove_duplicate=False):  # its base: this model's, the same
        if not is_adapter(name):
            state_dict.setdefault(prefix + name, parameter.detach())


def is_adapter(name):
    """Whether a parameter (or state-dict key) belongs to a LoRA adapter."""
    return ".lora_A." in name or ".lora_B." in name or name.startswith(("lora_A.", "lora_B."))


def is_lora_checkpoint(state):
    """Whether a state dict is a LoRA model's (its adapters and its base's hash, no base weights)."""
    return BASE_KEY in state


def merge_and_unload(model):
    """`model` (apply_lora's) with every adapter merged into the weight it adapts (peft's merge of each LoRA
    layer) and the layer replaced by the merged nn.Linear: the plain model, its state dict whole again."""
    peft = _peft()
    for name, module in list(model.named_modules()):
        if isinstance(module, peft.tuners.lora.LoraLayer):
            module.merge(safe_merge=True)
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, module.get_base_layer())
    for handle in getattr(model, "_lora_hooks", ()):
        handle.remove()
    for key in LORA_KEYS:
        model._buffers.pop(key, None)
    return model


ADAPTER_KEY = re.compile(r"^(.+)\.lora_([AB])\.([^.]+)\.weight$")


def merged_state(state, base, src="the checkpoint", base_path="--base"):
    """Our layout's full state dict of a LoRA checkpoint `state` (is_lora_checkpoint) with its adapters merged
    into `base` (a state dict in our layout, the weights they were trained on: its hash must be the checkpoint's),
    by peft's merge on a model of the adapted nn.Linear modules alone."""
    saved, own = _hex(state[BASE_KEY]), base_weights_hash(base)
    if saved != own:
        raise UserError(f"--base {base_path} is not the base weights the LoRA adapters of {src} were trained on "
                        f"(sha256 {own[:12]}..., the adapters' {saved[:12]}...); pass the run's "
                        "--pretrain_model_path as --base")
    adapters, modules = {}, {}
    for key, value in state.items():
        found = ADAPTER_KEY.match(key)
        if found:
            module = found[1].removesuffix(".base_layer")
            adapters[key] = value
            modules.setdefault(module, value)
    require(modules, f"{src} holds the hash of a LoRA base but no adapters: it is not a LoRA checkpoint")
    peft = _peft()
    rank = next(value.shape[0] for key, value in adapters.items() if ".lora_A." in key)
    alpha = float(state[ALPHA_KEY]) if ALPHA_KEY in state else float(rank)
    holder = torch.nn.Module()
    for module, like in modules.items():
        weight, bias = base[f"{module}.weight"], base.get(f"{module}.bias")
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        linear.weight = torch.nn.Parameter(weight.detach().to(like.dtype, copy=True), requires_grad=False)
        if bias is not None:
            linear.bias = torch.nn.Parameter(bias.detach().to(like.dtype, copy=True), requires_grad=False)
        *path, leaf = module.split(".")
        parent = holder
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, linear)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(modules), bias="none")
    holder = peft.inject_adapter_in_model(config, holder)
    unexpected = holder.load_state_dict(adapters, strict=False).unexpected_keys
    require(not unexpected, f"{src}: adapters of another shape ({', '.join(unexpected[:3])})")
    merged = merge_and_unload(holder)
    out = dict(base)
    out.update((key, value) for key, value in state.items() if key not in adapters and key not in LORA_KEYS)
    for module in modules:
        out[f"{module}.weight"] = merged.get_submodule(module).weight.detach()
    return out
