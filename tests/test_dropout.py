"""layers.dropout: masks that follow the sample. Within masks_follow_samples a sample's mask depends on the
run's key, the mask's call number and the sample's global position only, not on how the batch is cut;
its distribution is dropout's; a layout that does not hold the samples along the dimension named fails."""
import contextlib

import pytest
import torch
import torch.nn.functional as F

from torch import nn

from layers.dropout import (DropoutReport, KeyedDropout, attention, dropout_noise, keyed, mask_key,
                           masks_follow_samples)


def _masks(shape, first, samples, calls=2, key=mask_key(2021, 0), batch_dim=0):
    with masks_follow_samples(key, first, samples):
        return [dropout_noise(torch.empty(shape), 0.3 if call % 2 else 0.1, batch_dim) for call in range(calls)]


def test_a_sample_gets_its_masks_however_the_batch_is_cut():
    whole = _masks((8, 6, 5), 16, 8)
    halves = [_masks((4, 6, 5), 16, 4), _masks((4, 6, 5), 20, 4)]
    for call in range(2):
        assert torch.equal(whole[call], torch.cat([halves[0][call], halves[1][call]]))
    # rows of several per sample (channel-independent models: B * C rows, sample-major)
    assert torch.equal(_masks((24, 30), 0, 8)[0][6:12], _masks((6, 30), 2, 2)[0])


def test_masks_differ_by_call_key_and_position():
    first, second = _masks((8, 200), 0, 8, calls=3)[0::2]  # two calls at the same rate
    assert not torch.equal(first, second)
    assert not torch.equal(_masks((8, 200), 0, 8, key=mask_key(2021, 1))[0], _masks((8, 200), 0, 8)[0])
    shifted = _masks((8, 200), 1, 8)[0]
    assert torch.equal(shifted[:7], _masks((8, 200), 0, 8)[0][1:])


def test_the_samples_dimension_can_be_any():
    time_major = _masks((5, 8, 3), 0, 8, batch_dim=1)[0]  # [L, B, C], as TSMixer holds x
    assert torch.equal(time_major.permute(1, 0, 2), _masks((8, 5, 3), 0, 8)[0])


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("follow", [False, True])
def test_the_mask_is_dropouts(p, follow):
    torch.manual_seed(0)
    with masks_follow_samples(7, 0, 50) if follow else contextlib.nullcontext():
        noise = dropout_noise(torch.empty(50, 4000), p)
    assert noise.unique().tolist() == [0.0, pytest.approx(1 / (1 - p))]
    assert (noise == 0).float().mean().item() == pytest.approx(p, abs=0.005)
    assert noise.mean().item() == pytest.approx(1.0, abs=0.01)  # unbiased: the expected factor is 1


def test_a_layout_without_the_samples_in_front_is_refused():
    with masks_follow_samples(7, 0, 8), pytest.raises(RuntimeError, match="randomness_follows_sample = False"):
        dropout_noise(torch.empty(12, 5), 0.1)  # 12 rows are no whole number of rows per sample of 8


def test_outside_the_context_dropout_is_plain_and_eval_is_the_identity():
    assert not keyed()
    layer = KeyedDropout(0.5)
    x = torch.ones(4, 100)
    assert torch.equal(layer.eval()(x), x)
    torch.manual_seed(3)
    a = layer.train()(x)
    torch.manual_seed(3)
    assert torch.equal(a, layer(x))  # the global generator's draws, as before
    with masks_follow_samples(7, 0, 4):
        assert keyed()
        assert not torch.equal(layer(x), layer(x))  # two calls, two masks
    assert not keyed()


@pytest.mark.parametrize("causal, mask_kind", [(False, None), (True, None), (False, "bool"), (False, "float")])
def test_keyed_attention_is_sdpa(causal, mask_kind):  # (SDPA takes a mask or is_causal, not both)
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 2, 6, 8).unbind(0)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(6, 6) > 0.3
        mask.fill_diagonal_(True)
    elif mask_kind == "float":
        mask = torch.randn(6, 6)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    with masks_follow_samples(7, 0, 4):  # a rate so small that nothing is dropped
        got = attention(q, k, v, KeyedDropout(1e-12), attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _hashed(shape, first, samples, p=0.3, key=99):
    from layers.dropout import SampleKeys, _keyed_noise

    return _keyed_noise(torch.empty(shape), p, SampleKeys(key, first, samples), hashed=True)


def test_the_gpus_hashed_masks_follow_the_sample_and_are_dropouts():
    """Devices other than the CPU hash (key, element) for every element at once; run here on the CPU."""
    from utils.keyed_random import splitmix64

    whole = _hashed((8, 6, 5), 16, 8)
    assert torch.equal(whole, torch.cat([_hashed((4, 6, 5), 16, 4), _hashed((4, 6, 5), 20, 4)]))
    assert not torch.equal(whole, _hashed((8, 6, 5), 16, 8, key=100))
    # element j of sample s: the top 31 bits of mix64(mix64(call key ^ position) + j), kept below 0.7 * 2**31
    call_key = splitmix64(99 ^ splitmix64(0))
    for s, j in ((0, 0), (3, 17), (7, 29)):
        bits = splitmix64((splitmix64(call_key ^ (16 + s)) + j) % 2**64) >> 33
        assert whole[s].flatten()[j].item() == (pytest.approx(1 / 0.7) if bits < 0.7 * 2**31 else 0.0)
    noise = _hashed((50, 4000), 0, 50, p=0.1)
    assert noise.unique().tolist() == [0.0, pytest.approx(1 / 0.9)]
    assert (noise == 0).float().mean().item() == pytest.approx(0.1, abs=0.005)


def test_large_samples_drop_the_positions_a_per_sample_draw_gives():
    """Samples of 8k elements and more (p < 0.25): each sample's dropped positions from its own seed, the
    arithmetic on all at once (_keyed_dropped), equal to drawing them sample by sample (_fill_noise)."""
    from layers.dropout import _fill_noise, _keyed_dropped

    seeds = [11, 2**62 + 5, 7]
    batched = _keyed_dropped((3, 90, 100), 0.1, seeds, torch.Generator())
    for sample, seed in enumerate(seeds):
        alone = _fill_noise(torch.empty(90, 100), 0.1, torch.Generator().manual_seed(seed))
        assert torch.equal(batched[sample], alone)
    assert _masks((16, 9000), 0, 16)[0].eq(0).float().mean().item() == pytest.approx(0.1, abs=0.01)


def test_a_sample_whose_draws_fall_short_gets_the_per_sample_draw(monkeypatch):
    """When a sample's first round of gaps ends inside its rows (about 1e-9 a sample), _keyed_dropped draws
    that sample again as _fill_noise would, and none of its first-round positions leak into the mask."""
    import layers.dropout as dropout_module

    hits = dropout_module._hits

    def short_second_row(bits, log_miss):
        positions = hits(bits, log_miss)
        if positions.dim() == 2:  # the batched round, not _fill_noise's
            positions[1] = positions[1].div(1000).floor()  # sample 1's gaps collapsed: it ends inside its rows
        return positions

    monkeypatch.setattr(dropout_module, "_hits", short_second_row)
    seeds = [11, 2**62 + 5, 7]
    batched = dropout_module._keyed_dropped((3, 9000), 0.1, seeds, torch.Generator())
    for sample, seed in enumerate(seeds):
        alone = dropout_module._fill_noise(torch.empty(9000), 0.1, torch.Generator().manual_seed(seed))
        assert torch.equal(batched[sample], alone)


def test_masks_of_several_shapes_drawn_together_follow_the_sample():
    """dropout_noises under the keys (iTransformer's four masks of a layer in one draw per sample): cut the
    batch anywhere and each sample keeps its masks, whatever dimension holds the samples."""
    from layers.dropout import dropout_noises

    def noises(first, samples):
        with masks_follow_samples(5, first, samples):
            return dropout_noises(torch.empty(1), 0.2, (samples * 3, 4, 4), (6, samples, 8), batch_dims=(0, 1))

    whole, (top, bottom) = noises(0, 8), (noises(0, 5), noises(5, 3))
    assert torch.equal(whole[0], torch.cat([top[0], bottom[0]])) and torch.equal(whole[1], torch.cat([top[1], bottom[1]], 1))
    assert whole[1].shape == (6, 8, 8) and 0.15 < whole[1].eq(0).float().mean().item() < 0.25
    with masks_follow_samples(5, 0, 8), pytest.raises(RuntimeError, match="randomness_follows_sample"):
        dropout_noises(torch.empty(1), 0.2, (12, 4))


def test_sample_seeds_are_the_mixed_positions():
    from layers.dropout import _sample_seeds
    from utils.keyed_random import splitmix64

    call_key = splitmix64(2021 ^ splitmix64(3))
    assert _sample_seeds(call_key, 1000, 70) == [splitmix64(call_key ^ (1000 + s)) >> 1 for s in range(70)]


# ---------------------------------------------------------------- converted nn.Dropout (KeyedDropout.convert)
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.3))
        self.head = nn.Dropout(0.2)
        self.channels = nn.Dropout2d(0.1)


def test_convert_keys_every_nn_dropout_by_its_qualified_name():
    """As SyncBatchNorm.convert_sync_batchnorm: nn.Dropout modules become KeyedDropout of their rate, named;
    other dropout kinds stay and are reported as not keyed; no parameter or state_dict key changes."""
    net = _Net()
    keys_before = list(net.state_dict())
    report = DropoutReport()
    net = KeyedDropout.convert(net, report)
    assert isinstance(net.body[1], KeyedDropout) and (net.body[1].p, net.body[1].qualified_name) == (0.3, "body.1")
    assert isinstance(net.head, KeyedDropout) and net.head.qualified_name == "head"
    assert type(net.channels) is nn.Dropout2d and report.exact == {"channels": False}
    assert list(net.state_dict()) == keys_before and repr(net.head) == "KeyedDropout(p=0.2, inplace=False)"
    x = torch.ones(8, 3, 6)
    with masks_follow_samples(7, 0, 8):  # [B, ...] and a sample-major [B * k, ...] are keyed
        net.head(x), net.body[1](x.reshape(24, 6))
    assert report.exact == {"channels": False, "head": True, "body.1": True}


def test_a_converted_dropout_keys_each_sample_however_the_batch_is_cut():
    layer = KeyedDropout(0.5).train()
    x = torch.ones(8 * 3, 50)  # 3 rows per sample, sample-major

    def run(first, samples):
        with masks_follow_samples(11, first, samples):
            return layer(x[first * 3:(first + samples) * 3])

    whole = run(0, 8)
    assert set(whole.unique().tolist()) == {0.0, 2.0}  # it drops (a rate of 0.5 scales the kept by 2)
    assert torch.equal(whole, torch.cat([run(0, 4), run(4, 4)]))


def test_a_one_layer_hidden_state_is_keyed_along_its_second_dimension():
    """TSLib's SegRNN drops out its GRU's last hidden state, [1, B * C * segments, d_model]: the samples lie
    behind a leading 1, and each gets its masks however the batch is cut (and the report calls it exact)."""
    report = DropoutReport(warn=lambda line: None)
    layer = KeyedDropout(0.5, qualified_name="predict.0", report=report).train()
    x = torch.ones(1, 8 * 3, 50)

    def run(first, samples):
        with masks_follow_samples(5, first, samples):
            return layer(x[:, first * 3:(first + samples) * 3])

    whole = run(0, 8)
    assert whole.shape == x.shape and set(whole.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(whole, torch.cat([run(0, 2), run(2, 6)], dim=1))
    assert report.exact == {"predict.0": True}


def test_an_input_without_the_samples_in_front_falls_back_once_named():
    """A [features, B] input (12 rows for 8 samples) gets ordinary dropout; the report warns once, names the
    module, and records it as not exact; the next module keeps its call number (its masks stay keyed)."""
    lines = []
    report = DropoutReport(warn=lines.append)
    odd, after = (KeyedDropout(0.5, qualified_name=name, report=report) for name in ("mixer.drop", "head"))
    x = torch.ones(8, 40)

    def step(features):
        with masks_follow_samples(3, 0, 8):
            out = odd(torch.ones(features, 8))
            return out, after(x)

    out, keyed_after = step(12)
    _, keyed_after_again = step(12)
    assert out.shape == (12, 8) and set(out.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(keyed_after, keyed_after_again)  # keyed, the same call number both times
    assert report.exact == {"mixer.drop": False, "head": True}
    assert len(lines) == 1 and "dropout mixer.drop is not keyed by the sample" in lines[0]
    assert "(12, 8)" in lines[0] and "8 samples" in lines[0]


@pytest.mark.parametrize("per_sample", [True, False])
@pytest.mark.parametrize("causal, rows", [(True, 1), (False, 3)])
def test_keyed_attention_follows_the_sample(causal, rows, per_sample):
    """KeyedDropout.attend, as a GPU runs it (scaled_dot_product_attention once per sample, its `rows` rows,
    under the sample's seed) and as the CPU does (the weights formed, this module's masks): a sample's dropped
    weights are the same whichever micro-batch holds it; two calls in a forward differ; the global generator's
    stream is as if attention had not drawn."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 8 * rows, 2, 16, 4).unbind(0)
    layer = KeyedDropout(0.5).train()
    layer.per_sample_attention = per_sample

    def attend(first, samples):
        part = slice(first * rows, (first + samples) * rows)
        with masks_follow_samples(5, first, samples):
            return tuple(layer.attend(q[part], k[part], v[part], is_causal=causal) for _ in range(2))

    (whole, second), halves = attend(0, 8), (attend(0, 4), attend(4, 4))
    assert torch.equal(whole, torch.cat([halves[0][0], halves[1][0]]))
    assert torch.equal(second, torch.cat([halves[0][1], halves[1][1]])) and not torch.equal(whole, second)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert not torch.allclose(whole, plain)  # the weights were dropped
    torch.manual_seed(1)
    before = torch.rand(3)
    torch.manual_seed(1)
    attend(0, 8)
    assert torch.equal(torch.rand(3), before)
    assert torch.equal(layer.eval().attend(q, k, v, is_causal=causal), plain)
