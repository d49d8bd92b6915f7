"""Dropout masks that follow the sample, on a GPU: the hashed masks (one pass of elementwise kernels, not a
launch per sample) are the very masks the same hash gives on the CPU, so int64 products wrap and shifts stay
logical on the device too; and the zoo's models with dropout train alike as 1 x 8 and as 2 micro-batches of 4."""
import pytest
import torch

from gpu_helpers import DATA, ROWS, SMALL, model_args
from helpers import make_args, make_experiment
from layers.dropout import SampleKeys, _keyed_noise, mask_key


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_gpu_masks_are_the_hash_computed_on_the_cpu(p):
    key = mask_key(2021, 3)
    on_gpu = _keyed_noise(torch.empty(16, 7, 33, device="cuda"), p, SampleKeys(key, 100, 16))
    on_cpu = _keyed_noise(torch.empty(16, 7, 33), p, SampleKeys(key, 100, 16), hashed=True)
    assert torch.equal(on_gpu.cpu(), on_cpu)


# models whose training has dropout and reads no batch-mate (DLinear has no dropout; PatchTST's BatchNorm and
# TimesNet's batch periods read the batch, so their micro-batches cannot equal the whole batch by design)
DROPOUT_MODELS = {"TimerXL": model_args("TimerXL"),
                  "iTransformer": ["--model", "iTransformer", *SMALL, *DATA, "--synthetic_rows", ROWS]}


@pytest.mark.parametrize("model", sorted(DROPOUT_MODELS))
def test_accumulated_micro_batches_take_the_whole_batchs_step(model):
    """One train_step over a global batch of 8 windows, whole and as 2 accumulated micro-batches of 4, with
    dropout 0.1 on cuda: the same gradients (to 1e-4 of their norm), because each window keeps its masks."""
    from data_provider.data_factory import data_provider

    gradients = []
    for batch_size, accumulation in ((8, 1), (4, 2)):
        exp = make_experiment(make_args(*DROPOUT_MODELS[model], "--dropout", 0.1, "--batch_size", batch_size,
                                        "--accumulation_steps", accumulation))
        assert any("Dropout" in type(m).__name__ and getattr(m, "p", 0) > 0 for m in exp.raw_model.modules()), \
            f"{model} has no dropout here: the test would prove nothing"
        if getattr(exp.raw_model, "batch_dependent", None) or any(
                isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in exp.raw_model.modules()):
            pytest.skip(f"{model} reads its batch-mates in training (batch statistics): not invariant by design")
        assert exp.device.type == "cuda"
        _, loader = data_provider(exp.args, "train", exp.device)
        loader.set_epoch(1)
        exp.model.train()
        exp.train_step(next(iter(loader.steps())), exp.make_optimizer())
        gradients.append(torch.cat([p.grad.flatten() for p in exp.raw_model.parameters() if p.grad is not None]))
    assert float((gradients[0] - gradients[1]).norm() / gradients[0].norm()) < 1e-4
