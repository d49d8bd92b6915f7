"""A buffer that training updates from each micro-batch alone (a user model's running mean of its inputs, BatchNorm's
running statistics without --sync_bn) makes training depend on how the global batch is split: on 2 processes x 8 the
model trains differently from 1 x 16. The experiment cannot make such a buffer exact, so it finds it with the probe
forward it already runs before training and says so once, on rank 0, at start-up; a model whose buffers are fixed,
or BatchNorm under --sync_bn without accumulation, gets no such line."""
import contextlib
import io
import re

import pytest
import torch
from torch import nn

from exp.exp_basic import probe_training_step, unsynchronised_buffers
from helpers import output_args, records, run_on_ranks

# A user's file: its forward keeps a running mean of the inputs it sees in training, and adds it to the output.
RUNNING_MEAN_MODEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)
        self.register_buffer("input_mean", torch.zeros(configs.enc_in))
        self.register_buffer("table", torch.arange(4.0))  # fixed: never changes

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        if self.training:
            with torch.no_grad():
                self.input_mean.mul_(0.9).add_(0.1 * x_enc.mean(dim=(0, 1)))
        return self.linear(x_enc.transpose(1, 2)).transpose(1, 2) + self.input_mean + 0 * self.table.sum()
'''
BATCH_NORM_MODEL = '''
from torch import nn


class Model(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.norm = nn.BatchNorm1d(configs.enc_in)
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        return self.linear(self.norm(x_enc.transpose(1, 2))).transpose(1, 2)
'''
RUN = ["--model", "UserModel", "--synthetic_rows", 400, "--synthetic_channels", 3, "--seq_len", 24, "--label_len", 12,
       "--pred_len", 12, "--train_epochs", 1, "--global_batch_size", 16, "--learning_rate", 0.01, "--num_threads", 1,
       "--no_plots"]
WARNING = re.compile(r"^warning: model UserModel: training updates \d+ buffers from each micro-batch alone", re.M)


def run_user_model(rank, world_size, source, argv):
    """run.py's main on this rank with `--model UserModel` being `source`'s Model: (exit code, what it printed)."""
    import types
    from unittest import mock

    import run

    module = types.ModuleType("user_model")
    exec(compile(source, "UserModel.py", "exec"), module.__dict__)
    printed = io.StringIO()
    with mock.patch("exp.settings.get_model_class", return_value=module.Model), \
            mock.patch("utils.distributed.cleanup"), contextlib.redirect_stdout(printed):
        try:
            code = run.main(list(map(str, argv)))
        except SystemExit as exc:
            code = exc.code
    return code, printed.getvalue()


def _run(tmp_path, name, source, world_size, *argv):
    folder = tmp_path / name
    results = run_on_ranks(run_user_model, world_size, source, [*RUN, *argv, *output_args(folder)], timeout=200)
    assert [code for code, _ in results] == [0] * world_size, results[0][1][-2000:]
    return results[0][1], records(folder)[-1]


def test_a_running_mean_of_the_inputs_is_named_once_at_start_up_and_does_train_differently(tmp_path):
    one, one_record = _run(tmp_path, "one", RUNNING_MEAN_MODEL, 1)
    two, two_record = _run(tmp_path, "two", RUNNING_MEAN_MODEL, 2)
    accumulated, _ = _run(tmp_path, "accumulated", RUNNING_MEAN_MODEL, 1, "--accumulation_steps", 2)
    assert not WARNING.search(one), one  # one process, one micro-batch a step: nothing to say
    for printed, split in ((two, "2 processes"), (accumulated, "2 accumulation steps")):
        lines = WARNING.findall(printed)
        assert len(lines) == 1, printed
        line = next(line for line in printed.splitlines() if WARNING.match(line))
        assert "(input_mean)" in line and "table" not in line and split in line, line
        assert "--sync_bn" not in line, line  # no BatchNorm here: that way out would not help
    # what the line warns of: the buffer follows each rank's micro-batch, the metrics move with the world size
    assert two_record["mse"] != pytest.approx(one_record["mse"], rel=1e-6)


def test_batch_norm_without_sync_bn_is_named_with_its_way_out_and_not_under_sync_bn(tmp_path):
    plain, _ = _run(tmp_path, "plain", BATCH_NORM_MODEL, 2)
    synced, _ = _run(tmp_path, "synced", BATCH_NORM_MODEL, 2, "--sync_bn")
    line = next((line for line in plain.splitlines() if WARNING.match(line)), plain)
    assert "norm.running_mean" in line and "BatchNorm: add --sync_bn" in line, line
    assert not WARNING.search(synced), synced


def test_the_probe_names_changed_buffers_and_which_sync_bn_makes_global():
    model = nn.Module()
    model.norm = nn.BatchNorm1d(4)
    model.linear = nn.Linear(4, 4)
    model.register_buffer("fixed", torch.ones(2))
    x = torch.randn(6, 4)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    missing, changed = probe_training_step(model, lambda m: m.linear(m.norm(x)).sum(), torch.device("cpu"))
    assert missing == [] and changed == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), f"{key} changed by the probe"
    assert unsynchronised_buffers(model, changed, accumulation_steps=1) == changed
    from utils.ddp import GlobalBatchNorm
    model.norm = GlobalBatchNorm.convert(model.norm)
    assert unsynchronised_buffers(model, changed, accumulation_steps=1) == []
    assert unsynchronised_buffers(model, changed, accumulation_steps=2) == changed  # micro-batch statistics
