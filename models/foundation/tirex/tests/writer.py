"""TiRex's folder as the contract (tests/test_foundation.py) and this release's own tests write it: the package's
TiRexZero at a reduced size in model.ckpt, as NX-AI/TiRex ships it."""
import json

from test_foundation import LEVELS_9

REDUCED = {"input_patch_size": 32, "output_patch_size": 32, "quantiles": LEVELS_9,
           "block_kwargs": {"embedding_dim": 24, "num_heads": 2, "num_blocks": 2, "all_slstm": True, "vocab_size": 0},
           "input_ff_dim": 40}


def write(release, seed=0, train_ctx_len=512, lacking=None, hyper=None, drop=None, other=False, edit=None):
    """`release`/model.ckpt as the hub lays it out: the package's TiRexZero at a reduced size (2 blocks of 2
    heads), random weights (it leaves the sLSTM's as torch.empty), its blocks under `block_stack.` as the package's
    loader expects to strip. Damaged: `lacking` "model.ckpt" (a folder of its README only) or "hyper_parameters";
    `hyper` another model's hyper_parameters; `drop` a tensor; `other` Chronos-Bolt's files in its place; `edit`
    a function of the state dict."""
    import torch

    release.mkdir(parents=True)
    (release / "README.md").write_text(f"{release.name}\n")
    if other:
        from safetensors.torch import save_file

        (release / "config.json").write_text(json.dumps({"architectures": ["ChronosBoltModelForForecasting"],
                                                         "model_type": "t5"}))
        save_file({"shared.weight": torch.zeros(2, 2)}, str(release / "model.safetensors"))
        return release
    if lacking == "model.ckpt":
        return release
    from tirex.models.tirex import TiRexZero

    model = TiRexZero("torch", REDUCED, train_ctx_len=train_ctx_len)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.named_parameters():
            scale = 0.3 if value.dim() > 1 else 0.2
            value.copy_(torch.randn(value.shape, generator=generator) * scale + (1 if name.endswith("norm.weight")
                                                                                 or "norm_" in name else 0))
    state = {("block_stack." + k if k.startswith(("blocks.", "out_norm.")) else k): v
             for k, v in model.state_dict().items()}
    state.pop(drop and "block_stack." + drop, None)
    if edit:
        edit(state)
    checkpoint = {"state_dict": state, "epoch": 0,
                  "hyper_parameters": hyper or {"model_config": REDUCED, "train_ctx_len": train_ctx_len}}
    if lacking == "hyper_parameters":
        del checkpoint["hyper_parameters"]
    torch.save(checkpoint, release / "model.ckpt")
    return release
