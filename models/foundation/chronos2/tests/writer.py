"""Chronos-2's folder as the contract (tests/test_foundation.py) and this release's own tests write it: the
package's Chronos2Model at a reduced size, saved as amazon/chronos-2 is."""
from models.foundation.chronos2 import adapter
from test_foundation import damage

SIZES = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.1, reg_token_id=1)


def write(release, seed=0, lacking=None, config=None, drop=None, **forecasting):
    """The package's Chronos2Model at a reduced size (one pass forecasts 2 patches, 32 steps), its weights random
    and away from their small initial scale, saved as amazon/chronos-2 is; `forecasting`: chronos_config fields."""
    import torch
    from chronos.chronos2 import Chronos2CoreConfig, Chronos2Model

    torch.manual_seed(seed)
    forecasting = {**adapter.RELEASED_FORECASTING, "max_output_patches": 2, **forecasting}
    model = Chronos2Model(Chronos2CoreConfig(**SIZES, chronos_config=forecasting))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(release)
    return damage(release, lacking, config, drop)
