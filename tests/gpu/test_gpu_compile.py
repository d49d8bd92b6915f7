"""--compile on a GPU changes speed, not training: with gradient accumulation the compiled model's gradients
are the eager model's."""
import pytest
import torch

from gpu_helpers import MODEL_NAMES, model_args
from helpers import make_args, make_experiment

BATCH = 8


def _one_accumulated_step(argv):
    """Exp_Forecast on cuda: one train_step over the first two micro-batches of the training split; returns
    (weights after the step, each parameter's .grad or None)."""
    from data_provider.data_factory import data_provider

    exp = make_experiment(make_args(*argv))
    assert exp.device.type == "cuda"
    dataset, _ = data_provider(exp.args, "train", exp.device)
    micro_batches = [dataset.__getitems__(torch.arange(i * BATCH, (i + 1) * BATCH)) for i in range(2)]
    optimizer = exp.make_optimizer()
    exp.model.train()
    exp.train_step(micro_batches, optimizer)
    # train_step zeroes gradients before its group, so .grad holds the whole step's gradient
    weights = {name: p.detach().clone() for name, p in exp.raw_model.named_parameters()}
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in exp.raw_model.named_parameters()}
    return weights, grads


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_compiled_accumulated_gradients_equal_eager(model):
    """Two experiments from the same arguments and seed (dropout 0, learning rate 0), one with --compile, take one
    train_step over the same 2 micro-batches (--accumulation_steps 2) and every parameter's .grad agrees
    (rtol 1e-4, atol 1e-6)."""
    argv = [*model_args(model), "--dropout", 0, "--learning_rate", 0, "--accumulation_steps", 2, "--batch_size", BATCH]
    eager_weights, eager = _one_accumulated_step(argv)
    compiled_weights, compiled = _one_accumulated_step([*argv, "--compile"])
    assert sorted(compiled) == sorted(eager)
    for name, weight in eager_weights.items():  # the same start (and learning rate 0 kept it)
        assert torch.equal(compiled_weights[name], weight), name
    assert any(g is not None and g.abs().max() > 0 for g in eager.values()), "no gradient at all"
    for name, grad in eager.items():
        assert (compiled[name] is None) == (grad is None), f"{name}: a gradient on one side only"
        if grad is not None:
            torch.testing.assert_close(compiled[name], grad, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, name=name: f"{model} {name}: {m}")
