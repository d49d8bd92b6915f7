"""Speed work must not change a model's mathematics: every zoo model, loaded with the weights saved in
tests/golden/model_outputs.pt, gives the saved forecast and the saved parameter gradients of the training
loss on the saved batch (the contract configuration, trained a few steps first so nothing sits at its
initial value), to float tolerance.

The zoo's models (models.ZOO) must have them; a user's model outside the zoo is skipped, the reason saying
what joining the zoo takes. A deliberate change of a model's function (not of its speed) rewrites its
entry, and says so in its commit; a model joining the zoo writes its first:
    python tests/test_model_outputs.py --write [NAME ...]      # default: every model of the zoo
"""
import sys
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":  # the repository and tests/ on the path, as tests/conftest.py puts them
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from helpers import make_args, make_experiment  # noqa: E402
from models import ZOO, available_models  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden" / "model_outputs.pt"
WARM_STEPS = 3


def _experiment(name):
    from test_model_contract import CONTRACT_ARGS

    # the contract configuration with its script's learning rate set aside: a few steps move every weight
    return make_experiment(make_args("--model", name, *CONTRACT_ARGS, "--learning_rate", 0.01))


def _loss(exp, batch):
    from exp.forward import forward
    from utils.metrics import batch_loss

    pred, true = forward(exp.raw_model, batch, exp.args, "train", exp.device)
    return pred, batch_loss(pred.float(), true, exp.args.loss)


def record(name):
    """(state_dict, batch, forecast, gradients) of `name` after WARM_STEPS training steps."""
    from data_provider.data_factory import data_provider

    exp = _experiment(name)
    _, loader = data_provider(exp.args, "train")
    optimizer = exp.make_optimizer()
    batches = iter(loader)
    exp.raw_model.train()
    for _ in range(WARM_STEPS):
        exp.train_step([next(batches)], optimizer)
    batch = next(batches)
    # buffers a fresh build already holds (TimeXer's positional table) are not stored: the test takes them from it
    built = dict(_experiment(name).raw_model.named_buffers())
    state = {k: v.clone() for k, v in exp.raw_model.state_dict().items()
             if not (k in built and torch.equal(built[k], v))}
    return {"state_dict": state, "batch": batch, **_outputs(exp, batch)}


def _outputs(exp, batch):
    exp.raw_model.train()  # dropout is 0 in the contract configuration; BatchNorm uses the batch
    exp.raw_model.zero_grad(set_to_none=True)
    pred, loss = _loss(exp, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in exp.raw_model.named_parameters() if p.grad is not None}
    return {"forecast": pred.detach().clone(), "grads": grads}


@pytest.fixture(scope="module")
def golden():
    return torch.load(GOLDEN, weights_only=True)


@pytest.mark.parametrize("name", available_models())
def test_a_model_computes_what_it_computed_before(golden, name):
    write = f"python tests/test_model_outputs.py --write {name}"
    if name not in golden and name not in ZOO:
        pytest.skip(f"{name} is not in the zoo (models.ZOO), so it needs no golden outputs; to join the zoo: "
                    f"{write} (models/README.md#joining-the-zoo)")
    assert name in golden, f"no golden outputs for {name}, a model of the zoo: {write}"
    saved = golden[name]
    exp = _experiment(name)
    exp.raw_model.load_state_dict({**exp.raw_model.state_dict(), **saved["state_dict"]}, strict=True)
    now = _outputs(exp, saved["batch"])
    torch.testing.assert_close(now["forecast"], saved["forecast"], rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"{name}'s forecast changed: {m}")
    assert sorted(now["grads"]) == sorted(saved["grads"])
    # a gradient that is nearly zero (PatchTST's key bias, mathematically zero) holds rounding noise of the
    # size of the model's larger gradients, which differs from one CPU's kernels to another's (AMD against
    # Intel: 2.4e-8 in a gradient of 8.8e-6, the largest 0.13): the floor follows the model's largest gradient
    largest = max(grad.abs().max().item() for grad in saved["grads"].values())
    for key, grad in saved["grads"].items():
        scale = grad.abs().max().item()
        atol = max(1e-5 * max(scale, 1e-3), 1e-6 * largest)
        torch.testing.assert_close(now["grads"][key], grad, rtol=1e-3, atol=atol,
                                   msg=lambda m, key=key: f"{name}'s gradient of {key} changed: {m}")


def test_a_users_model_is_skipped_naming_what_joining_the_zoo_takes():
    """A user's file dropped into models/ is collected, and skipped with the command that writes its golden
    outputs; a model of the zoo without them fails."""
    with pytest.raises(pytest.skip.Exception) as skipped:
        test_a_model_computes_what_it_computed_before({}, "MyModel")  # no golden outputs of its own
    assert str(skipped.value) == ("MyModel is not in the zoo (models.ZOO), so it needs no golden outputs; to join "
                                  "the zoo: python tests/test_model_outputs.py --write MyModel "
                                  "(models/README.md#joining-the-zoo)")
    with pytest.raises(AssertionError, match="no golden outputs for DLinear, a model of the zoo: "):
        test_a_model_computes_what_it_computed_before({}, "DLinear")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"] or not set(sys.argv[2:]) <= set(available_models()):
        sys.exit(f"usage: python tests/test_model_outputs.py --write [NAME ...] (names from {', '.join(available_models())})")
    GOLDEN.parent.mkdir(exist_ok=True)
    saved = torch.load(GOLDEN, weights_only=True) if GOLDEN.exists() else {}
    saved.update({name: record(name) for name in sys.argv[2:] or ZOO})  # the other models' entries stay
    torch.save(saved, GOLDEN)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size / 1e6:.2f} MB)")
