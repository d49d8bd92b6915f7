"""The lab's cross-checks and one-off measurements (lab/README.md) that the suite still runs: drop_last_effect.py,
the TF32 emulation, and the TSLib and OpenLTM cross-checks' imports of a checkout. A lab script retired goes with
its test here."""
import json
import sys

import numpy as np
import pytest
import torch

from lab.drop_last_effect import main as drop_last_main
from test_benchmarks import _record


def test_drop_last_effect_scores_the_windows_such_a_loader_keeps(tmp_path, capsys):
    # 10 windows with MSE 0..9: a drop_last loader of batch 4 scores windows 0-7 only.
    run = tmp_path / "results" / "setting"
    run.mkdir(parents=True)
    errors = np.column_stack([np.arange(10), np.arange(10.0), np.arange(10.0) / 10])
    np.savetxt(run / "window_errors.csv", errors, fmt="%g", delimiter=",", header="window,mse,mae", comments="")
    (run / "metrics.json").write_text(json.dumps(_record("TimeMixer", "ETTh1", 96, 2021, 4.5, 0.45)))
    drop_last_main([str(tmp_path / "results"), "--batch_size", "4", "10"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("| TimeMixer ETTh1 96 seed 2021 | 10 | 4.5000 | 0.4500 | 4 | 8 | 3.5000 | 0.3500 "
                        "| 8.5000 | -22.2% |")
    assert lines[3].startswith("| TimeMixer ETTh1 96 seed 2021 | 10 | 4.5000 | 0.4500 | 10 | 10 | 4.5000 | 0.4500 | nan |")

    # a variant's label names its --des and an explicit evaluation batch
    variant = tmp_path / "variant" / "setting"
    variant.mkdir(parents=True)
    np.savetxt(variant / "window_errors.csv", errors, fmt="%g", delimiter=",", header="window,mse,mae", comments="")
    (variant / "metrics.json").write_text(json.dumps(
        _record("TimeMixer", "ETTh1", 96, 2021, 4.5, 0.45, des="tiled_marks", eval_batch_size=128)))
    drop_last_main([str(tmp_path / "variant"), "--batch_size", "4"])
    assert capsys.readouterr().out.splitlines()[2].startswith(
        "| TimeMixer ETTh1 96 seed 2021 (tiled_marks, eval batch 128) | 10 |")

    (run / "window_errors.csv").write_text("mse\n1\n")
    with pytest.raises(SystemExit, match="not a window_errors.csv from run.py"):
        drop_last_main([str(run / "window_errors.csv"), "--batch_size", "4"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="holds no window_errors.csv"):
        drop_last_main([str(tmp_path / "empty"), "--batch_size", "4"])
    with pytest.raises(SystemExit, match="not found; give window_errors.csv files"):
        drop_last_main([str(tmp_path / "missing"), "--batch_size", "4"])


def test_tf32_emulation_rounds_operands_and_incoming_gradients():
    """lab/tf32: a convolution's operands are rounded to TF32 (10 mantissa bits, ties away
    from zero) and so is the gradient it receives, so its input and weight gradients are TF32
    products too; the rounding is visible against plain fp32."""
    import importlib.util
    from pathlib import Path
    from torch.nn import functional as F

    path = Path(__file__).resolve().parents[1] / "lab" / "tf32" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("tf32_emulation", path)
    tf32 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tf32)  # under its own name: nothing in torch is patched
    assert F.conv2d.__name__ == "conv2d"

    values = torch.tensor([1 + 2**-11, 1 + 2**-12, -(1 + 2**-11), 1 + 3 * 2**-11, 0.0])
    assert tf32.to_tf32(values).tolist() == [1 + 2**-10, 1.0, -(1 + 2**-10), 1 + 2**-9, 0.0]

    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    out = tf32.in_tf32(F.conv2d)(x, w, None, padding=1)
    x_tf32, w_tf32 = (tf32.to_tf32(t.detach()).requires_grad_() for t in (x, w))
    expected = F.conv2d(x_tf32, w_tf32, None, padding=1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert not torch.equal(out, F.conv2d(x, w, None, padding=1))
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(tf32.to_tf32(grad))
    torch.testing.assert_close(x.grad, x_tf32.grad, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, w_tf32.grad, rtol=0, atol=0)


def test_tslib_crosscheck_imports_the_checkout_then_gives_our_packages_back(tmp_path):
    """TSLib's packages are called models/ and layers/ like ours: the cross-check imports its
    TimesNet from the checkout, refuses a folder our package would shadow (it would compare our
    model with itself), and leaves our own modules in place afterwards."""
    from lab.tslib_crosscheck import tslib_timesnet
    from utils.errors import UserError
    import models.TimesNet as ours

    checkout = tmp_path / "Time-Series-Library"
    (checkout / "models").mkdir(parents=True)
    (checkout / "models" / "TimesNet.py").write_text("WHOSE = 'theirs'\n")
    with pytest.raises(UserError, match="__init__.py"):  # a namespace folder loses to our package
        tslib_timesnet(checkout)
    (checkout / "models" / "__init__.py").write_text("")
    assert tslib_timesnet(checkout).WHOSE == "theirs"
    import models.TimesNet
    assert models.TimesNet is ours and sys.modules["models.TimesNet"] is ours
    with pytest.raises(UserError, match="no models/TimesNet.py"):
        tslib_timesnet(tmp_path)


def test_tslib_crosscheck_reads_the_checkouts_padding_and_refuses_another(tmp_path):
    """TSLib pads a period grid with zeros since fd74cbc and with the series' last steps before it: the
    cross-check reads which one a checkout does instead of trusting --padding."""
    from lab.tslib_crosscheck import checkout_padding, main, tslib_timesnet
    from utils.errors import UserError

    block = """import torch
from torch import nn
class TimesBlock(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.length = configs.seq_len + configs.pred_len
        self.conv = nn.Identity()
    def forward(self, x):
        missing = -self.length % 3
        extra = torch.zeros_like(x[:, :missing]) if PADDING == "zeros" else x[:, self.length - missing:]
        return self.conv(torch.cat([x, extra], 1).reshape(len(x), -1, 3, x.shape[2]).permute(0, 3, 1, 2))
"""
    for padding in ("zeros", "tail"):
        (tmp_path / padding / "models").mkdir(parents=True)
        (tmp_path / padding / "models" / "__init__.py").write_text("")
        (tmp_path / padding / "models" / "TimesNet.py").write_text(f"PADDING = {padding!r}\n" + block)
        assert checkout_padding(tslib_timesnet(tmp_path / padding)) == padding
    with pytest.raises(UserError, match="pads period grids with tail, not zeros: pass --padding tail"):
        main(["--tslib", str(tmp_path / "tail")])  # zeros by default
    with pytest.raises(UserError, match="with zeros, not tail"):
        main(["--tslib", str(tmp_path / "zeros"), "--padding", "tail"])


def test_openltm_crosscheck_imports_the_checkout_and_refuses_what_is_not_one(tmp_path):
    """OpenLTM's models/, layers/ and utils/ are named like ours: its Timer-XL and Timer come from the
    checkout, ours stay in place afterwards, and a folder without OpenLTM's files is refused by name."""
    from lab.openltm_crosscheck import openltm_modules
    from utils.errors import UserError
    import utils.checkpoint as ours

    checkout = tmp_path / "OpenLTM"
    for folder in ("models", "layers", "utils"):
        (checkout / folder).mkdir(parents=True)
    for name in ("models/timer_xl.py", "models/timer.py", "layers/SelfAttention_Family.py", "utils/masking.py"):
        (checkout / name).write_text(f"WHOSE = 'theirs: {name}'\n")
    with pytest.raises(UserError, match="__init__.py"):  # a namespace folder loses to our package
        openltm_modules(checkout)
    (checkout / "models" / "__init__.py").write_text("")
    modules = openltm_modules(checkout)
    assert modules["TimerXL"].WHOSE == "theirs: models/timer_xl.py" and modules["Timer"].WHOSE == "theirs: models/timer.py"
    import utils.checkpoint
    assert utils.checkpoint is ours and sys.modules["utils.checkpoint"] is ours
    (checkout / "utils" / "masking.py").unlink()
    with pytest.raises(UserError, match="has no utils/masking.py"):
        openltm_modules(checkout)


def test_drop_last_effect_reads_a_probabilistic_runs_window_errors(tmp_path):
    """A probabilistic run's window_errors.csv carries each window's sums after window,mse,mae."""
    from lab.drop_last_effect import read_errors

    path = tmp_path / "window_errors.csv"
    path.write_text("window,mse,mae,count,abs_label\n0,0.5,0.25,96,10\n1,1.5,0.75,96,11\n")
    np.testing.assert_array_equal(read_errors(path), [[0.5, 0.25], [1.5, 0.75]])
