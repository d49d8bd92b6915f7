"""--use_amp and --compile change speed, never results: bf16 AMP trains to nearly the fp32 result, a
compiled model saves plain checkpoints and accumulates the eager model's gradients, and fp16 AMP is refused
on CPU."""
import os

import pytest
import torch

from helpers import assert_compiled_gradients_equal_eager, assert_ok, make_args, make_experiment, records, run_cli
from utils.errors import UserError


def test_bf16_amp_trains_to_nearly_the_fp32_result(tmp_path):
    argv = ["--train_epochs", 2, "--synthetic_rows", 2500]
    assert_ok(run_cli(tmp_path, *argv))
    assert_ok(run_cli(tmp_path, *argv, "--use_amp"))
    fp32, amp = records(tmp_path)
    assert amp["mse"] == pytest.approx(fp32["mse"], rel=0.02)
    assert amp["args"]["use_amp"] is True


def test_compiled_training_saves_plain_checkpoints(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500, "--compile"))
    compiled = records(tmp_path)[-1]
    state = torch.load(tmp_path / "checkpoints" / compiled["setting"] / "checkpoint.pth", weights_only=True)
    assert sorted(state) == ["Linear_Seasonal.bias", "Linear_Seasonal.weight", "Linear_Trend.bias", "Linear_Trend.weight"]
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500))
    assert records(tmp_path)[-1]["mse"] == pytest.approx(compiled["mse"], rel=1e-4)


def test_compiled_accumulated_gradients_equal_eager():
    """torch.compile's backward gives DLinear's two biases one gradient tensor, which autograd stored as both
    .grad: the second micro-batch's gradient was added twice (found by the GPU tier on its first H100 run;
    the same on this CPU). Exp_Basic.backward gives each parameter its own .grad again."""
    argv = ["--synthetic_rows", 1500, "--dropout", 0, "--learning_rate", 0, "--accumulation_steps", 2,
            "--batch_size", 8, "--use_gpu", "false"]
    assert_compiled_gradients_equal_eager(argv, 8, "DLinear")


def test_fp16_is_refused_on_cpu():
    with pytest.raises(UserError, match="--amp_dtype fp16 needs a GPU"):
        make_experiment(make_args("--use_amp", "--amp_dtype", "fp16", "--use_gpu", "false"))


@pytest.fixture
def restore_precision():
    yield
    from utils.tools import set_precision

    set_precision(False, False)


@pytest.mark.parametrize("tf32, deterministic", [(False, False), (True, False), (False, True)])
def test_precision_is_what_the_arguments_say(tf32, deterministic, monkeypatch, restore_precision):
    """PyTorch's own default gives cuDNN convolutions TF32 on Ampere+ GPUs (matmuls not): TimesNet,
    TimeMixer and the token embeddings computed in TF32 unasked. Each experiment sets both kernels'
    precision and determinism from --tf32 and --deterministic."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.backends.cudnn.allow_tf32 = not tf32  # the opposite of what the run asks for
    torch.set_float32_matmul_precision("highest" if tf32 else "high")
    torch.use_deterministic_algorithms(not deterministic)
    make_experiment(make_args("--synthetic_rows", 1500, *(["--tf32"] if tf32 else []),
                              *(["--deterministic"] if deterministic else [])))
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
    assert torch.are_deterministic_algorithms_enabled() is deterministic
    assert torch.backends.cudnn.deterministic is deterministic and torch.backends.cudnn.benchmark is False
    assert ("CUBLAS_WORKSPACE_CONFIG" in os.environ) is deterministic


def test_deterministic_runs_train_every_model_and_are_recorded(tmp_path):
    """--deterministic makes PyTorch refuse kernels without a deterministic version: every zoo model's
    training step has one (on this CPU), and metrics.json records both precision switches."""
    from data_provider.data_factory import data_provider
    from models import available_models
    from test_model_contract import CONTRACT_ARGS
    from utils.tools import set_precision

    try:
        for name in available_models():
            exp = make_experiment(make_args("--model", name, *CONTRACT_ARGS, "--deterministic"))
            assert torch.are_deterministic_algorithms_enabled()
            _, loader = data_provider(exp.args, "train")
            loss, _ = exp.train_step([next(iter(loader))], exp.make_optimizer())
            assert torch.isfinite(loss), name
    finally:
        set_precision(False, False)
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500, "--deterministic"))
    recorded = records(tmp_path)[-1]["args"]
    assert (recorded["deterministic"], recorded["tf32"]) == (True, False)


def test_bf16_amp_is_refused_on_a_gpu_without_bfloat16(monkeypatch):
    """A V100 or T4 has no bfloat16: CUDA autocast failed at the first forward with a traceback."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    from exp.settings import resolve_args

    with pytest.raises(UserError, match="--use_amp uses bfloat16, which this GPU does not support; add --amp_dtype fp16"):
        resolve_args(make_args("--use_amp", "--synthetic_rows", 1500), 1)
    resolve_args(make_args("--use_amp", "--amp_dtype", "fp16", "--synthetic_rows", 1500), 1)  # fp16 is fine there


@pytest.mark.parametrize("name", ["TSMixer", "TimeMixer", "iTransformer", "PatchTST"])
def test_compiled_training_forward_has_no_graph_break_at_dropout(name):
    """Under --compile masks come from the global generator; layers.dropout then hands dropout to F.dropout
    (layers.dropout.fused_dropout), which the compiler fuses with the work around it. Its own mask drawing
    (integer draws, index_fill_, in-place products) broke the graph at every dropout: TSMixer compiled ran
    1.03x eager instead of 1.22x. Each model's own dropout path is covered: add_dropout (TSMixer), an
    in-place mask (TimeMixer), masks drawn for a layer at once (iTransformer), the Dropout module (PatchTST)."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward
    from test_model_contract import CONTRACT_ARGS

    exp = make_experiment(make_args("--model", name, *CONTRACT_ARGS, "--dropout", 0.2))
    _, loader = data_provider(exp.args, "train")
    batch = next(iter(loader))
    exp.raw_model.train()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda: forward(exp.raw_model, batch, exp.args, "train", exp.device))()
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]


CONV_BATCH_NORM_MODEL = '''
from torch import nn


class Model(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.conv = nn.Conv1d(configs.enc_in, configs.enc_in, 3, padding=1)
        self.norm = nn.BatchNorm1d(configs.enc_in)
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        return self.linear(self.norm(self.conv(x_enc.transpose(1, 2)))).transpose(1, 2)
'''


def test_global_batch_norm_trains_under_bf16_amp_on_two_processes(tmp_path):
    """--sync_bn on the CPU is GlobalBatchNorm: under autocast its input is the Conv1d's bfloat16 output, whose
    statistics were reduced in bfloat16 and whose mean `running_mean.lerp_` (float32) refused. Statistics in float32,
    as SyncBatchNorm's kernels keep them; 2 gloo processes, 2 epochs (the second's last step is short)."""
    from helpers import output_args, run_on_ranks
    from test_unsynchronised_buffers import RUN, run_user_model

    folder = tmp_path / "amp"
    argv = [*RUN, "--train_epochs", 2, "--sync_bn", "--use_amp", *output_args(folder)]
    results = run_on_ranks(run_user_model, 2, CONV_BATCH_NORM_MODEL, argv, timeout=200)
    assert [code for code, _ in results] == [0, 0], results[0][1][-2000:]
    assert records(folder)[-1]["mse"] < 10


def test_global_batch_norm_keeps_float32_statistics_and_the_input_dtype():
    """_global_batch_norm (one process standing in for the all-reduce) on a bfloat16 input: float32 running
    statistics equal to those of the input in float32, output in bfloat16; a float32 input is unchanged."""
    from unittest import mock

    from torch import nn
    from utils import ddp

    torch.manual_seed(0)
    x = torch.randn(6, 4, 5) * 3 + 1
    with mock.patch.object(ddp._SummedOverRanks, "apply", lambda t: t):
        layers = [nn.BatchNorm1d(4) for _ in range(3)]
        reference = ddp._global_batch_norm(layers[0], x.bfloat16().float())
        out = ddp._global_batch_norm(layers[1], x.bfloat16())
        plain = ddp._global_batch_norm(layers[2], x)
    assert out.dtype == torch.bfloat16 and layers[1].running_mean.dtype == torch.float32
    assert torch.equal(layers[1].running_mean, layers[0].running_mean)
    assert torch.equal(layers[1].running_var, layers[0].running_var)
    assert torch.equal(out, reference.bfloat16())
    expected = nn.BatchNorm1d(4).train()(x)
    torch.testing.assert_close(plain, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_keyed_attention_trains_under_bf16_autocast(fused):
    """Keyed attention's backward recomputes the weights: under autocast it must do so with the forward's dtypes
    (it mixed float32 weights with bfloat16 values and raised). An additive float32 mask (T5's position bias)
    makes the weights float32 while the projections are bfloat16; the gradients are near float32's."""
    from layers.dropout import KeyedDropout, masks_follow_samples

    torch.manual_seed(0)
    x = torch.randn(4, 2, 16, 8)
    bias = torch.randn(1, 2, 16, 16)
    projections = [torch.nn.Linear(8, 8) for _ in range(3)]
    layer = KeyedDropout(0.3).train()
    layer.fused_attention = fused

    def grads(amp):
        inputs, mask = x.clone().requires_grad_(), bias.clone().requires_grad_()
        for projection in projections:
            projection.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp), masks_follow_samples(5, 0, 4):
            out = layer.attend(*(projection(inputs) for projection in projections), attn_mask=mask)
        out.float().square().sum().backward()
        return [inputs.grad, mask.grad, *(p.weight.grad for p in projections)]

    for amp, full in zip(grads(True), grads(False)):
        assert amp.dtype == torch.float32 and torch.isfinite(amp).all()
        torch.testing.assert_close(amp, full, rtol=0.05, atol=0.05 * full.abs().max().item())


def _keyed_attention_releases():
    """The releases whose fine-tuning run in tests/test_foundation.py keys attention dropout (by its row)."""
    from test_foundation import RELEASES

    return [name for name, row in RELEASES.items() if row.keyed or row.tune_folder]


@pytest.mark.parametrize("name", _keyed_attention_releases())
def test_a_release_fine_tunes_under_bf16_amp_with_keyed_attention_dropout(name, tmp_path):
    """A fine-tuning step of a release whose attention dropout is keyed, under --use_amp on the CPU (its first
    step raised in keyed attention's backward), from the tiny folders tests/test_foundation.py writes."""
    from test_foundation import RELEASES, TUNE, needs, released_folder, run_args, write_etth1_shaped

    row = needs(RELEASES[name])
    folder = released_folder(row, tmp_path / "release", **({"edit_config": row.tune_folder} if row.tune_folder
                                                             else {}))
    argv = [*run_args(row, write_etth1_shaped(tmp_path / "etth1"), folder), *TUNE, *row.tune, "--use_amp",
            "--dropout", 0.1]
    assert_ok(run_cli(tmp_path / "runs", *argv))
    record = records(tmp_path / "runs")[-1]
    assert record["args"]["use_amp"] is True and record["mse"] == record["mse"]
