"""TimesFM 2.5's folder as the contract (tests/test_foundation.py) and this release's own tests write it: the
package's module at a reduced definition, saved as google/timesfm-2.5-200m-pytorch is."""
import json

import pytest

from test_foundation import damage


def reduced_definition():
    """The released TimesFM 2.5 definition at a small size, every width its own so that no two are mixed up."""
    import dataclasses

    from timesfm.timesfm_2p5 import timesfm_2p5_base

    released = timesfm_2p5_base.TimesFM_2p5_200M_Definition()
    block = released.stacked_transformers
    return dataclasses.replace(
        released,
        tokenizer=dataclasses.replace(released.tokenizer, hidden_dims=40, output_dims=32),
        stacked_transformers=dataclasses.replace(block, num_layers=2, transformer=dataclasses.replace(
            block.transformer, model_dims=32, hidden_dims=48, num_heads=4)),
        output_projection_point=dataclasses.replace(released.output_projection_point, input_dims=32, hidden_dims=24),
        output_projection_quantiles=dataclasses.replace(released.output_projection_quantiles, input_dims=32,
                                                        hidden_dims=20))


def write(release, lacking=None, config=None, tensors=None):
    """A folder as google/timesfm-2.5-200m-pytorch is laid out, written by the package at the reduced definition
    (random weights: the package starts its norm scales at zero, which would silence every layer); or, given
    `config` (config.json) and `tensors` ({name: shape} of zeros in model.safetensors), a folder of just those."""
    import torch

    if config is not None or tensors is not None:
        release.mkdir(parents=True)
        if config is not None:
            (release / "config.json").write_text(json.dumps(config))
        if tensors is not None:
            from safetensors.torch import save_file

            save_file({key: torch.zeros(shape) for key, shape in tensors.items()}, str(release / "model.safetensors"))
        return release
    from timesfm.timesfm_2p5 import timesfm_2p5_torch as package

    # the package draws its matrices from the global generator: seeded, so the folder does not depend on test order
    with pytest.MonkeyPatch.context() as patch, torch.random.fork_rng():
        torch.manual_seed(0)
        patch.setattr(package.TimesFM_2p5_200M_torch_module, "config", reduced_definition())
        model = package.TimesFM_2p5_200M_torch(torch_compile=False)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, value in model.model.named_parameters():
                if value.dim() == 1:
                    value.copy_(torch.randn(value.shape, generator=generator) * 0.5 + (0 if "bias" in name else 1))
        model.save_pretrained(release)
    return damage(release, lacking)
