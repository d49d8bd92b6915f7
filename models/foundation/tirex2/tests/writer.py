"""TiRex-2's folder as the contract (tests/test_foundation.py) and this release's own tests write it: the package's
TiRex2 at a reduced size, saved as NX-AI/TiRex-2 is (config.json + model.safetensors, each group of aliased tensors
stored once under its alphabetically first name, found by the package's own shared_tensor_groups)."""
import json

from test_foundation import damage


def reduced_config(context_len=96, future_len=64, tta_sign_flip=False, recipe=("mlstm_attn", "slstm_attn")):
    """The presumed release's layout at a small size: a bi-mLSTM and a bi-sLSTM block, 16 wide, 2 heads."""
    from models.foundation.tirex2.adapter import presumed_config

    config = presumed_config(width=16, heads=2, blocks=len(recipe), input_ff_dim=24, context_len=context_len,
                             future_len=future_len)
    config["stack_config"]["recipe"] = list(recipe)
    config.update(h_expand=2, dropout=0.1, tta_sign_flip=tta_sign_flip)
    for template in config["stack_config"]["templates"].values():
        template["dropout"] = 0.1  # as the package's test configuration: a pre-training setting, read as 0 here
    return config


def release_tensors(model):
    """The package model's state_dict as the release stores it: one name per alias group (sorted: the first)."""
    from tirex2._state_dict import shared_tensor_groups

    state = model.state_dict()
    for group in shared_tensor_groups(model):
        for name in group[1:]:
            state.pop(name, None)
    return {key: value.detach().contiguous() for key, value in state.items()}


def write(release, seed=0, lacking=None, config=None, drop=None, edit_config=None, tensors=None, truncate=False,
          **sizes):
    """`release`/ as the hub lays it out: the package's TiRex2 at reduced_config(**sizes) with random weights.
    Damaged: `lacking` a file; `config` over config.json; `drop` a tensor; `edit_config` fields over config.json;
    `tensors` ({name: shape} of zeros) alone in model.safetensors; `truncate` model.safetensors cut to half."""
    import torch
    from safetensors.torch import save_file
    from tirex2 import TiRex2

    release.mkdir(parents=True)
    fields = reduced_config(**sizes)
    if tensors is not None:
        save_file({key: torch.zeros(shape) for key, shape in tensors.items()}, str(release / "model.safetensors"))
        (release / "config.json").write_text(json.dumps(config if config is not None else fields))
        return release
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TiRex2(**fields, device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.named_parameters():
            if value.dim() > 1:
                value.copy_(torch.randn(value.shape, generator=generator) * 0.6 / value.shape[-1] ** 0.5)
            else:
                value.add_(torch.randn(value.shape, generator=generator) * 0.1)
    save_file(release_tensors(model), str(release / "model.safetensors"), metadata={"format": "pt"})
    (release / "config.json").write_text(json.dumps({**fields, **(edit_config or {})}, indent=2))
    if truncate:
        weights = release / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    return damage(release, lacking, config, drop)
