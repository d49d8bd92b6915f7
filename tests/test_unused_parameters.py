"""A model file that builds layers its configuration never uses (TSLib's FEDformer, ETSformer, MSGNet, ...): plain
DDP stops at its second step ("Expected to have finished reduction"); the experiment finds such parameters with one
probe forward/backward before training and wraps DDP with find_unused_parameters, so the file trains unchanged and
alike on any number of processes.

The same runs hold BatchNorm under --sync_bn through an epoch whose last global batch has fewer windows than
processes (200 rows: 105 training windows, 13 x 8 + 1; 202 rows: 106, which 3 processes share as 0 + 1 + 1): the
ranks without a window run a stand-in pass whose BatchNorm joins the others' all-reduce adding nothing, so every rank
normalises with the step's statistics and keeps the running statistics one process has (they used to normalise on
their own window and keep rank 0's statistics, which had not seen the last window: test MSE 2.1555 on 2 processes
vs 2.1444)."""
import pytest
import torch
from torch import nn

from exp.exp_basic import parameters_without_gradient
from helpers import output_args, records, run_on_ranks

# A TSLib-style file: a spare layer built but never read, BatchNorm (running statistics) and dropout.
SPARE_LAYER_MODEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.norm = nn.BatchNorm1d(configs.enc_in)
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)
        self.dropout = nn.Dropout(0.2)
        self.spare = nn.Linear(configs.d_model, configs.d_model)  # built, never used

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        x = self.norm(x_enc.transpose(1, 2))
        return self.dropout(self.linear(x)).transpose(1, 2)
'''
RUN = ["--model", "SpareLayer", "--synthetic_rows", 200, "--synthetic_channels", 3, "--seq_len", 24,
       "--label_len", 12, "--pred_len", 12, "--d_model", 8, "--train_epochs", 1, "--patience", 10,
       "--global_batch_size", 8, "--sync_bn", "--num_threads", 1, "--no_plots"]


def run_user_model(rank, world_size, model_file, argv, probe):
    """run.py's main on each rank with `--model SpareLayer` being the file's Model; the exit code. Without `probe`
    the experiment's search for unused parameters is switched off (the bug this file guards against: plain DDP
    then stops at the second step on every rank); with probe "told", no probe forward runs either, but the model is
    wrapped with find_unused_parameters outright, as a user who knew of the spare layer would ask."""
    import contextlib
    import importlib.util
    import io
    from unittest import mock

    import run

    spec = importlib.util.spec_from_file_location("user_spare_layer", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    patches = [mock.patch("exp.settings.get_model_class", return_value=module.Model),
               contextlib.redirect_stdout(io.StringIO()), mock.patch("utils.distributed.cleanup")]
    if not probe:
        patches.append(mock.patch("exp.exp_basic.Exp_Basic.allow_unused_parameters", return_value=[]))
    elif probe == "told":
        patches.append(mock.patch("exp.exp_basic.Exp_Basic.allow_unused_parameters", _find_unused_without_probe))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        try:
            return run.main(list(map(str, argv)))
        except SystemExit as exc:
            return exc.code
        except Exception:  # plain DDP's RuntimeError at the second step
            return 1


def _find_unused_without_probe(self, dataset):
    """Exp_Basic.allow_unused_parameters' outcome for this model, told rather than probed: DDP with
    find_unused_parameters, and no forward before training."""
    from utils import ddp

    self.model = ddp.wrap_ddp(self.raw_model, self.device, find_unused=True)[1]
    return ["spare.weight", "spare.bias"]


def _run(tmp_path, name, world_size, *argv, probe=True):
    model_file = tmp_path / "SpareLayer.py"
    model_file.write_text(SPARE_LAYER_MODEL)
    folder = tmp_path / name
    codes = run_on_ranks(run_user_model, world_size, str(model_file), [*RUN, *argv, *output_args(folder)], probe,
                         timeout=200)
    return codes, folder


@pytest.mark.parametrize("rows", [200, 202])  # last global batch: 1 window (105 = 13 x 8 + 1); 2 windows
def test_a_file_with_an_unused_layer_trains_alike_on_1_2_and_3_processes(tmp_path, rows):
    runs = {}
    for name, world, argv in (("1 x 8", 1, ()), ("2 x 4", 2, ()), ("3 processes", 3, ("--batch_size", 3))):
        codes, folder = _run(tmp_path, name.replace(" ", "_"), world, "--synthetic_rows", rows, *argv)
        assert codes == [0] * world, f"{name}: exit codes {codes}"
        runs[name] = records(folder)[-1]
    (_, first), *others = runs.items()
    for name, record in others:
        for key in ("mse", "mae"):
            assert record[key] == pytest.approx(first[key], rel=1e-6, abs=0), f"{name}: {key}"
        for got, want in zip(record["history"], first["history"]):
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6, abs=0), name


def test_the_probe_names_the_unused_and_leaves_the_model_as_it_was():
    model = nn.Module()
    model.used = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    model.spare = nn.Linear(2, 2)
    model.frozen = nn.Linear(2, 2).requires_grad_(False)  # no gradient wanted: not reported
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(6, 4)
    torch.manual_seed(5)
    missing = parameters_without_gradient(model, lambda m: m.used(x).sum(), torch.device("cpu"))
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3)), "the probe's dropout consumed the global random stream"
    assert missing == ["spare.weight", "spare.bias"]
    assert all(p.grad is None for p in model.parameters())
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), f"{key} changed by the probe"


def test_the_probe_leaves_training_as_a_run_that_never_probed(tmp_path):
    """The probe's forward before training is undone: the run trains and scores as one whose DDP was told to find
    unused parameters and ran no probe (the 1, 2 and 3 process runs above all probe, so they cannot tell). Planted:
    the probe leaving BatchNorm's running statistics as its forward set them fails here."""
    runs = {}
    for name, world, probe in (("told", 1, "told"), ("probed", 1, True), ("probed on 2", 2, True)):
        codes, folder = _run(tmp_path, name.replace(" ", "_"), world, probe=probe)
        assert codes == [0] * world, f"{name}: exit codes {codes}"
        runs[name] = records(folder)[-1]
    reference = runs.pop("told")
    for name, record in runs.items():
        for key in ("mse", "mae", "vali_loss"):
            assert record[key] == pytest.approx(reference[key], rel=1e-6, abs=0), f"{name}: {key}"
        for got, want in zip(record["history"], reference["history"]):
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6, abs=0), name
