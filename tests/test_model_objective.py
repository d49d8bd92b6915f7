"""A model's own training objective (`computes_loss`: given the window's future it returns one loss per window)
and its own random draws (layers.noise), as the released foundation models use them: the experiment weights the
per-window losses into the global batch's mean, and the draws follow the window, so training and sampled
forecasts are the same on any number of processes and at any batch size."""
import pytest
import torch

from helpers import output_args, records, run_on_ranks

# A user's model: a linear forecast plus sampled noise (evaluation), trained on a noisy per-window objective
# whose noise comes from layers.noise (a stand-in for flow matching's noise and time).
OWN_OBJECTIVE_MODEL = '''"""Linear forecast, sampled; trained on its own noisy objective."""
import torch
from torch import nn

from layers import noise

KEYED = {keyed}


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    computes_loss = True

    def __init__(self, configs):
        super().__init__()
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)

    def draw(self, rows, length, device):
        return noise.randn(rows, length, device=device) if KEYED else torch.randn(rows, length, device=device)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None, target=None):
        batch, _, channels = x_enc.shape
        forecast = self.linear(x_enc.transpose(1, 2))  # [B, C, pred_len]
        eps = self.draw(batch * channels, forecast.shape[-1], x_enc.device).view_as(forecast)
        if target is None:
            return (forecast + 0.3 * eps).transpose(1, 2)  # one sample: the draws decide the metrics
        t = noise.rand(batch, 1, device=x_enc.device) if KEYED else torch.rand(batch, 1)
        errors = (forecast + t.unsqueeze(-1) * eps - target.transpose(1, 2)) ** 2
        return errors.flatten(1).mean(1)  # [B]: each window's loss
'''
RUN = ["--model", "OwnObjective", "--synthetic_rows", 500, "--synthetic_channels", 2, "--seq_len", 32,
       "--label_len", 16, "--pred_len", 16, "--train_epochs", 2, "--patience", 10, "--learning_rate", 0.01,
       "--num_threads", 1, "--no_plots"]


def run_user_model(rank, world_size, model_file, argv):
    """run.py's main on each rank with `--model OwnObjective` being the file's Model; the exit code."""
    import contextlib
    import importlib.util
    import io
    from unittest import mock

    import run

    spec = importlib.util.spec_from_file_location("user_own_objective", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with (mock.patch("exp.settings.get_model_class", return_value=module.Model),
          contextlib.redirect_stdout(io.StringIO()), mock.patch("utils.distributed.cleanup")):
        return run.main(list(map(str, argv)))


def _run(tmp_path, name, world_size, *argv, keyed=True):
    model_file = tmp_path / f"OwnObjective_{keyed}.py"
    model_file.write_text(OWN_OBJECTIVE_MODEL.format(keyed=keyed))
    folder = tmp_path / name
    codes = run_on_ranks(run_user_model, world_size, str(model_file), [*RUN, *argv, *output_args(folder)], timeout=200)
    assert codes == [0] * world_size
    return records(folder)[-1]


def _same(runs, keys=("mse", "mae")):
    (first_name, first), *others = runs.items()
    for name, record in others:
        for key in keys:
            assert record[key] == pytest.approx(first[key], rel=1e-6, abs=0), f"{name} vs {first_name}: {key}"
        for got, want in zip(record["history"], first["history"]):
            for key in ("train_loss", "vali_loss"):
                assert got[key] == pytest.approx(want[key], rel=1e-6, abs=0), f"{name} vs {first_name}: {key}"


def test_a_models_own_objective_and_draws_train_and_sample_the_same_on_any_world_size(tmp_path):
    """1 x 16, 2 x 8 and 3 processes sharing the global batch of 16: the same losses, weights and sampled
    forecasts; the test's sampled forecasts also at another --eval_batch_size. The training loss logged is the
    mean of the per-window losses the model returned."""
    runs = {"1 x 16": _run(tmp_path, "one", 1, "--batch_size", 16),
            "2 x 8": _run(tmp_path, "two", 2, "--batch_size", 8, "--eval_batch_size", 5),
            "3 x 16/3": _run(tmp_path, "three", 3, "--global_batch_size", 16, "--batch_size", 6)}
    _same(runs)
    assert runs["1 x 16"]["history"][-1]["train_loss"] > 0


def test_unkeyed_draws_make_sampled_forecasts_depend_on_the_world_size(tmp_path):
    """The planted bug the first test guards against: the same model drawing from torch's global generator."""
    one = _run(tmp_path, "one", 1, "--batch_size", 16, keyed=False)
    two = _run(tmp_path, "two", 2, "--batch_size", 8, keyed=False)
    assert one["mse"] != pytest.approx(two["mse"], rel=1e-6, abs=0)


def test_draws_follow_the_window_key_and_call_and_are_plain_outside_the_contexts():
    from layers import noise
    from layers.dropout import masks_follow_samples

    with noise.draws_follow_windows([11, 12, 13]):
        whole = noise.randn(6, 4)
        second = noise.randn(6, 4)  # the next call: other numbers
    with noise.draws_follow_windows([12]):
        alone = noise.randn(2, 4)
    torch.testing.assert_close(whole[2:4], alone, rtol=0, atol=0)  # window 12's rows, whatever its batch
    assert not torch.equal(whole, second)
    with masks_follow_samples(7, 10, 2):
        training = noise.rand(4, 3)
    with masks_follow_samples(7, 11, 1):
        later = noise.rand(2, 3)
    torch.testing.assert_close(training[2:], later, rtol=0, atol=0)  # the sample at position 11, in any batch
    with pytest.raises(RuntimeError, match="cannot follow the batch's 3 windows"):
        with noise.draws_follow_windows([1, 2, 3]):
            noise.randn(4, 2)
    torch.manual_seed(0)
    plain = noise.randn(2, 2)
    torch.manual_seed(0)
    torch.testing.assert_close(plain, torch.randn(2, 2))
