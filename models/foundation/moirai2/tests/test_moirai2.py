"""Moirai 2.0 against uni2ts 2.0.0 through a committed fixture: tests/fixture/ (beside this file) is a tiny
configuration in the released layout (config.json + model.safetensors) written by uni2ts's own
Moirai2Module.save_pretrained, and expected.safetensors holds uni2ts's Moirai2Forecast.predict quantiles on fixed
windows (models/foundation/moirai2/crosscheck.py --write-fixture, run where uni2ts is installed). Here: the folder loads
through our adapter and forecasts those quantiles; the decoder-only quantile loss is a loop over tokens and heads;
an export of ours writes the release's config.json. What every release shares (zero-shot and fine-tuning on several
processes, the export's layout, the bad inputs) is tests/test_foundation.py's contract."""
import json
import math
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.foundation.moirai2 import Moirai2
from exp.export import export, load_weights
from utils.errors import UserError
from utils.host_syncs import record_host_syncs, summary, to_meta

FIXTURE = Path(__file__).resolve().parent / "fixture"
SEQ_LEN, HORIZONS = 30, (8, 21)  # models/foundation/moirai2/crosscheck.FIXTURE_SEQ_LEN / FIXTURE_HORIZONS


def configs(folder, seq_len, pred_len, **sizes):
    return Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=None if folder is None else str(folder),
                     **{"d_model": 16, "n_heads": 2, "e_layers": 1, "d_ff": 32, "dropout": 0.0, **sizes})


def ours(folder, seq_len, pred_len):
    return load_weights(Moirai2.Model(configs(folder, seq_len, pred_len)), str(folder)).eval()


@pytest.fixture(scope="module")
def expected():
    return load_file(FIXTURE / "expected.safetensors")


@pytest.mark.parametrize("horizon", HORIZONS, ids=["one-forward", "rolled-out"])
def test_quantiles_equal_uni2ts_moirai2forecast_predict(expected, horizon):
    """30 steps: 8 patches of 4, the first 2 steps padding; 8 steps are the 2 tokens of one forward, 21 steps 6
    tokens, 4 of them by recursive multi-quantile decoding (the last token 3 steps past the horizon). Window 1's
    third channel is constant (its scale the scaler's floor)."""
    windows = expected["windows"]
    with torch.no_grad():
        got = ours(FIXTURE, SEQ_LEN, horizon)(windows)
    want = expected[f"forecast_{horizon}"]
    assert got.shape == want.shape == (2, horizon, 3, 9)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_agreement_sees_a_changed_weight(expected):
    """Not vacuous: one q-norm weight of the last layer 5 % larger moves the quantiles far past the tolerance."""
    model = ours(FIXTURE, SEQ_LEN, 21)
    with torch.no_grad():
        model.moirai.encoder.layers[1].self_attn.q_norm.weight.mul_(1.05)
        got = model(expected["windows"])
    want = expected["forecast_21"]
    assert (got - want).abs().max() > 1e-3 * want.abs().max()


def test_the_training_loss_is_each_tokens_heads_against_the_next_patches():
    """Model.training_loss against a loop written apart from it: every token t of context ++ horizon, its
    network run on the tokens up to t alone (causal), head h's quantiles scored on token t + 1 + h's observed
    steps (pinball, mean over levels, in the scaled space of the context's scaler); one mean per series, then
    per window over channels."""
    model = ours(FIXTURE, SEQ_LEN, 10)
    generator = torch.Generator().manual_seed(5)
    x, future = torch.randn(2, SEQ_LEN, 2, generator=generator).cumsum(1), torch.randn(2, 10, 2, generator=generator)
    with torch.no_grad():
        got = model(x, target=future)
        levels = torch.tensor(model.quantile_levels).view(-1, 1)
        per_series = []
        for b in range(2):
            for c in range(2):
                past, past_seen = model.patches(x[b:b + 1, :, c], left=True)
                ahead, ahead_seen = model.patches(future[b:b + 1, :, c], left=False)
                tokens, seen = torch.cat([past, ahead], 1), torch.cat([past_seen, ahead_seen], 1)
                loc, scale = Moirai2.std_scaler(past, past_seen)
                total, count = 0.0, 0.0
                for t in range(tokens.shape[1]):
                    out, _, _ = model.moirai(tokens[:, :t + 1], seen[:, :t + 1], scaled_output=True,
                                             scaling=(loc, scale))
                    for h in range(model.tokens_ahead):
                        if t + 1 + h >= tokens.shape[1]:
                            continue
                        truth = (tokens[0, t + 1 + h] - loc[0, 0]) / scale[0, 0]
                        error = truth - out[0, t, h]  # [Q, patch]
                        pinball = torch.maximum(levels * error, (levels - 1) * error).mean(0)
                        total += float((pinball * seen[0, t + 1 + h]).sum())
                        count += float(seen[0, t + 1 + h].sum())
                per_series.append(total / count)
    want = torch.tensor(per_series).view(2, 2).mean(1)
    assert got.shape == (2,)
    assert torch.allclose(got, want.to(got.dtype), rtol=1e-5, atol=0)


def test_the_model_is_built_at_the_folders_sizes_and_without_one_at_configs():
    model = Moirai2.Model(configs(FIXTURE, 96, 48))
    layer = model.moirai.encoder.layers[0]
    assert (len(model.moirai.encoder.layers), layer.self_attn.heads, layer.self_attn.head_dim, layer.ffn.fc1.out_features,
            model.patch, model.tokens_ahead) == (2, 1, 64, 16, 4, 2)
    scratch = Moirai2.Model(configs(None, 96, 48))
    layer = scratch.moirai.encoder.layers[0]
    assert (len(scratch.moirai.encoder.layers), layer.self_attn.heads, layer.ffn.fc1.out_features, scratch.patch,
            scratch.tokens_ahead) == (1, 2, 32, 16, 4)
    with pytest.raises(ValueError, match=r"at most 64 tokens of 4 steps .* --seq_len 200 \+ --pred_len 60 make 65"):
        Moirai2.Model(configs(FIXTURE, 200, 60))
    Moirai2.Model(configs(FIXTURE, 200, 56))  # 50 + 14 tokens: the most it takes


def test_the_released_size_is_11_4m_parameters():
    """Without a folder, at the released sizes (--d_model 384 --n_heads 6 --e_layers 6 --d_ff 1024), the model is
    Moirai 2.0 small's 11,387,208 parameters (the count of uni2ts's Moirai2Module at the released config)."""
    model = Moirai2.Model(configs(None, 512, 64, d_model=384, n_heads=6, e_layers=6, d_ff=1024))
    assert sum(p.numel() for p in model.parameters()) == 11_387_208


def test_the_any_variate_bias_is_a_constant_softmax_ignores(expected):
    """Why ours leaves the release's var_attn_bias out of attention: with one variate every pair takes the
    'same variate' value, one constant per head, and adding it to the scores changes no forecast."""
    model = ours(FIXTURE, SEQ_LEN, 21)
    attention = model.moirai.encoder.layers[0].self_attn
    plain = Moirai2.attention

    def with_bias(q, k, v, dropout, is_causal, scale):
        same = model.moirai.variate_bias[0].emb.weight[1].view(1, -1, 1, 1)  # the same-variate bias per head
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        bias = same.expand(q.shape[0], -1, q.shape[-2], k.shape[-2]).masked_fill(~mask, float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)

    with torch.no_grad():
        before = model(expected["windows"])
        model.moirai.variate_bias[0].emb.weight[1] = 3.0
        Moirai2.attention = with_bias
        try:
            after = model(expected["windows"])
        finally:
            Moirai2.attention = plain
    assert attention.heads == 1 and (after - before).abs().max() <= 1e-5 * before.abs().max()


def test_an_export_writes_the_releases_layout_and_config(tmp_path):
    """Changed weights exported to the release's layout: the fixture's tensor names and shapes, its config.json with
    the fields no weight shows written as released (max_seq_len 512, dropout 0), read back alike."""
    model = ours(FIXTURE, 96, 48)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    export(str(tmp_path / "checkpoint.pth"), str(exported), "moirai2")
    released, written = (load_file(folder / "model.safetensors") for folder in (FIXTURE, exported))
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in released.items()}
    assert json.loads((exported / "config.json").read_text()) == json.loads((FIXTURE / "config.json").read_text()) | {
        "max_seq_len": 512}
    windows = torch.randn(2, 96, 3, generator=torch.Generator().manual_seed(3)).cumsum(1)
    with torch.no_grad():
        assert torch.equal(ours(exported, 96, 48)(windows), model(windows))


def test_the_any_variate_bias_gets_no_gradient():
    """Fine-tuning leaves the release's var_attn_bias as it was: a constant softmax ignores (above), frozen."""
    model = ours(FIXTURE, SEQ_LEN, 10).train()
    generator = torch.Generator().manual_seed(7)
    x, future = torch.randn(2, SEQ_LEN, 2, generator=generator).cumsum(1), torch.randn(2, 10, 2, generator=generator)
    model(x, target=future).mean().backward()
    biases = [p for name, p in model.named_parameters() if "variate_bias" in name]
    assert biases and all(p.grad is None or not p.grad.any() for p in biases)


def test_an_export_of_a_model_the_release_cannot_describe_is_one_line(tmp_path):
    """The release has no heads field (uni2ts takes d_model // 64): 2 heads of d_model 16 cannot be written."""
    model = Moirai2.Model(configs(None, 96, 48))
    source = tmp_path / "scratch.pth"
    torch.save({"model": model.state_dict()}, source)
    with pytest.raises(UserError, match=r"2 heads of d_model 16; the release's format has no heads field"):
        export(str(source), str(tmp_path / "out"), "moirai2")
    assert not (tmp_path / "out").exists()


def test_a_rollout_keeps_the_first_forwards_tokens():
    """The first tokens of a rolled-out forecast are the one-forward forecast's (the rollout only appends)."""
    generator = torch.Generator().manual_seed(6)
    windows = torch.randn(3, SEQ_LEN, 2, generator=generator).cumsum(1)
    with torch.no_grad():
        short, long = ours(FIXTURE, SEQ_LEN, 8)(windows), ours(FIXTURE, SEQ_LEN, 21)(windows)
    assert torch.equal(long[:, :8], short)
    assert math.isfinite(float(long.sum()))


def test_a_bfloat16_copy_rolls_out_near_the_float32_forecast(expected):
    """The rollout's torch.quantile runs on float32 levels whatever the model's dtype (a bfloat16 buffer of levels
    would be rounded, and torch.quantile refuses mixed dtypes)."""
    windows = expected["windows"]
    with torch.no_grad():
        full = ours(FIXTURE, SEQ_LEN, 21)(windows)
        half = ours(FIXTURE, SEQ_LEN, 21).to(torch.bfloat16)(windows.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and half.shape == full.shape
    assert (half.float() - full).abs().max() <= 0.05 * full.abs().max()


def test_a_rollout_and_a_training_step_copy_nothing_from_the_host():
    """The quantile levels of the rollout's torch.quantile and of the loss live on the model's device (a buffer not
    in the state dict) and stay exact float32 in a bfloat16 copy: no roll-out step or batch builds them from the
    host (counted on the meta device: utils.host_syncs)."""
    model = ours(FIXTURE, SEQ_LEN, 21)
    assert "level_bits" not in model.state_dict()
    assert torch.equal(model.to(torch.bfloat16).levels(), torch.tensor(model.quantile_levels, dtype=torch.float32))
    model = to_meta(ours(FIXTURE, SEQ_LEN, 21))
    windows = to_meta(torch.randn(3, SEQ_LEN, 2))
    with record_host_syncs() as rec, torch.no_grad():
        model(windows)  # two roll-out steps after the first forward
    assert rec.syncs == [], summary(rec)
    with record_host_syncs() as rec:
        model.train()(windows, target=windows[:, :21]).sum().backward()
    assert rec.syncs == [], summary(rec)
