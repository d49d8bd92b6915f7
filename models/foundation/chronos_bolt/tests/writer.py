"""Chronos-Bolt's folder as the contract (tests/test_foundation.py) and this release's own tests write it: the
package's ChronosBoltModelForForecasting at a reduced size, saved by the package."""
from models.foundation.chronos_bolt import adapter
from test_foundation import damage

BLOCK = 16  # the reduced release's prediction_length: --pred_len 24 rolls out one block


def write(release, seed=0, lacking=None, config=None, drop=None, **chronos_config):
    """The package's ChronosBoltModelForForecasting at a reduced size (d_model 16, one layer each way, blocks of 16
    steps), random weights, saved by the package (config.json + model.safetensors)."""
    import torch
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    chronos_config = {"prediction_length": BLOCK, **chronos_config}
    reduced = adapter.released_config("tiny", d_model=16, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                                      d_kv=8, chronos_config=chronos_config)
    torch.manual_seed(seed)
    ChronosBoltModelForForecasting(T5Config.from_dict(reduced)).save_pretrained(release)
    return damage(release, lacking, config, drop)
