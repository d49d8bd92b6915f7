"""Mixed precision on GPUs: every zoo model trains under bf16 and fp16 autocast with finite losses, and an
fp16 overflow costs one skipped step and a lower loss scale, never the weights."""
import pytest
import torch

from gpu_helpers import is_finite_number, metrics_json, run_gpu, snapshot
from helpers import assert_ok, make_args, make_experiment
from models import available_models

# One small configuration every model reads its fields from (as tests/test_model_contract.py's), at GPU size.
ZOO_ARGS = ["--d_model", 32, "--d_ff", 64, "--n_heads", 2, "--e_layers", 1, "--d_layers", 1,
            "--seq_len", 96, "--label_len", 48, "--pred_len", 24, "--input_token_len", 24, "--output_token_len", 24,
            "--top_k", 2, "--num_kernels", 2, "--down_sampling_layers", 1, "--down_sampling_window", 2,
            "--down_sampling_method", "avg", "--data", "synthetic", "--synthetic_rows", 2000, "--train_epochs", 1]


@pytest.mark.parametrize("model", available_models())
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_model_trains_with_finite_losses_under_amp(tmp_path, dtype, model):
    """Each model of models/ trains one epoch on 1 GPU with --use_amp --amp_dtype bf16 / fp16 (fp16 with a
    GradScaler) and metrics.json's history holds finite train and validation losses."""
    if dtype == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 (compute capability < 8.0): --amp_dtype bf16 needs one")
    assert_ok(run_gpu(tmp_path, "--model", model, *ZOO_ARGS, "--use_amp", "--amp_dtype", dtype))
    record = metrics_json(tmp_path)
    assert record["args"]["use_amp"] is True and record["args"]["amp_dtype"] == dtype
    assert [h["epoch"] for h in record["history"]] == [1]
    for entry in record["history"]:
        for key in ("train_loss", "vali_loss"):
            assert is_finite_number(entry[key]), f"{model} {dtype}: {key} {entry[key]!r}"
    assert is_finite_number(record["mse"]), record["mse"]


def test_fp16_overflow_skips_the_step_and_lowers_the_loss_scale():
    """In-process on cuda with --use_amp --amp_dtype fp16: a batch scaled by 1e6 overflows the fp16 forward,
    train_step leaves every parameter as it was and halves grad_scaler's scale, and the next normal batch then
    updates the parameters to finite values."""
    from data_provider.data_factory import data_provider

    exp = make_experiment(make_args("--model", "DLinear", "--use_amp", "--amp_dtype", "fp16", "--synthetic_rows", 2000,
                                    "--seq_len", 96, "--pred_len", 24, "--batch_size", 8))
    assert exp.device.type == "cuda"
    dataset, _ = data_provider(exp.args, "train", exp.device)
    batch = dataset.__getitems__(torch.arange(8))
    x, y, *marks = batch
    # DLinear's GEMM runs in fp16, whose largest value is 65504: these inputs are inf once cast
    huge = (x * 1e6, y * 1e6, *marks)
    optimizer = exp.make_optimizer()
    exp.model.train()

    initial, scale = snapshot(exp.raw_model), exp.grad_scaler.get_scale()
    loss_sum, _ = exp.train_step([huge], optimizer)
    assert not torch.isfinite(loss_sum), "the scaled batch did not overflow; this test needs it to"
    for name, value in snapshot(exp.raw_model).items():
        assert torch.equal(value, initial[name]), f"{name} changed in a step whose gradients overflowed"
    assert exp.grad_scaler.get_scale() == scale * 0.5  # GradScaler's backoff_factor

    loss_sum, _ = exp.train_step([batch], optimizer)
    assert torch.isfinite(loss_sum)
    after = snapshot(exp.raw_model)
    assert all(torch.isfinite(value).all() for value in after.values())
    assert any(not torch.equal(after[name], initial[name]) for name in initial), "the normal batch moved nothing"
    assert exp.grad_scaler.get_scale() == scale * 0.5  # a finite step keeps it (growth waits 2000 steps)


def test_fp16_clipping_sees_the_unscaled_gradient():
    """--clip_grad under fp16's GradScaler: the norm is taken after unscaling, so it equals the fp32 step's
    norm (to fp16 rounding), not the loss scale (65536) times it, and the clipped gradient has norm --clip_grad."""
    from data_provider.data_factory import data_provider

    def step(*amp):
        exp = make_experiment(make_args("--model", "DLinear", "--synthetic_rows", 2000, "--seq_len", 96, "--pred_len", 24,
                                        "--batch_size", 8, "--clip_grad", 0.05, *amp))
        dataset, _ = data_provider(exp.args, "train", exp.device)
        exp.model.train()
        exp.train_step([dataset.__getitems__(torch.arange(8))], exp.make_optimizer())
        grads = torch.cat([p.grad.flatten().float() for p in exp.raw_model.parameters()])
        return exp.last_grad_norm.item(), grads.norm().item()

    fp32_norm, fp32_clipped = step()
    fp16_norm, fp16_clipped = step("--use_amp", "--amp_dtype", "fp16")
    assert fp32_norm > 0.05 and fp16_norm == pytest.approx(fp32_norm, rel=1e-2)
    assert fp16_clipped == pytest.approx(0.05, rel=1e-3) and fp32_clipped == pytest.approx(0.05, rel=1e-5)
