"""LoRA fine-tuning through peft (the `lora` extra): --lora_rank > 0 injects low-rank adapters into a model's
nn.Linear modules that --lora_targets names, and freezes everything else.

Exp_Basic applies it once, after the pre-trained weights are in and before layers.dropout keys every nn.Dropout:
peft's adapter dropout is an nn.Dropout, so it is keyed by the sample like every other (the same global batch
trains the same adapters on any number of processes).

--lora_targets are shell-style patterns (fnmatch) matched against an nn.Linear's last name (`q`) or its
qualified name (`encoder.block.0.layer.0.SelfAttention.q`). Left out, DEFAULT_TARGETS' names are taken, and a
model that has none of them (DLinear, TSMixer: linear maps only) adapts every nn.Linear. Modules that see the
samples in their second dimension (TIME_FIRST) are left out of the default.
"""
import fnmatch
import hashlib

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
# Modules that see the samples in their second dimension ([time, series, d]: a T5 encoder's group attention across
# the series, the second layer of each block): the adapters' dropout keys the first dimension, so they are left out
# of the default, and naming them with --lora_dropout > 0 is refused.
TIME_FIRST = ("*.layer.1.self_attention.*",)
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


def _time_first(name):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in TIME_FIRST)


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
    # the adapters' base goes into every checkpoint of the model (checkpoint.pth, last.pth), and a checkpoint
    # of other base weights is refused wherever it is loaded (a resume, an evaluation)
    model.register_buffer(BASE_KEY, torch.frombuffer(bytearray(bytes.fromhex(base)), dtype=torch.uint8))
    model.register_load_state_dict_pre_hook(_refuse_other_base)
    return model


BASE_KEY = "lora_base_sha256"


def base_weights_hash(model):
    """sha256 of `model`'s state dict (every name, dtype, shape and value's bytes, in order): its base weights'
    identity, computed once, before the adapters."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def _refuse_other_base(module, state_dict, prefix, *_):
    saved, own = state_dict.get(prefix + BASE_KEY), getattr(module, BASE_KEY)
    if saved is None or torch.equal(saved.cpu(), own.cpu()):
        return  # a missing key is the strict load's to name
    raise UserError(f"the checkpoint's LoRA adapters were trained on other base weights (sha256 "
                    f"{bytes(saved.cpu().tolist()).hex()[:12]}..., these {bytes(own.cpu().tolist()).hex()[:12]}...); "
                    "load it on the weights it was fine-tuned from: the same --pretrain_model_path with --adaptation")


def is_adapter(name):
    """Whether a parameter (or state-dict key) belongs to a LoRA adapter."""
    return ".lora_A." in name or ".lora_B." in name or name.startswith(("lora_A.", "lora_B."))
