"""Probabilistic forecasts (issue 38): the objectives, quantiles that never cross, samples that follow the
window, every zoo model trained with either objective, a model that cannot widen refused, and end to end:
quantile and sampled forecasts and every metric the same on 1, 2 and 3 processes and at two evaluation
batch sizes. The metrics themselves against gluonts: test_probabilistic_metrics.py."""
import math
from unittest import mock

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from helpers import SMALL_TIMERXL, assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks
from models import ZOO
from utils.metrics import GIFT_EVAL_LEVELS
from utils.probabilistic import (DEFAULT_LEVELS, DistributionObjective, QuantileObjective, SampleStream, parse_levels,
                                 sample_quantiles, student_t_icdf, window_keys)

LEVELS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
SMALL = ["--data", "synthetic", "--synthetic_rows", 1000, "--seq_len", 48, "--label_len", 24, "--pred_len", 24]


# ------------------------------------------------------------------ objectives
def test_pinball_loss_is_the_mean_over_levels_and_elements():
    objective = QuantileObjective((0.1, 0.5, 0.9))
    params, true = torch.randn(2, 3, 4, 3), torch.randn(2, 3, 4)
    expected = np.mean([max(q * (y - f), (q - 1) * (y - f))
                        for (y, row) in zip(true.flatten().tolist(), params.reshape(-1, 3).tolist())
                        for q, f in zip((0.1, 0.5, 0.9), row)])
    assert objective.loss(params, true).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", ["studentt", "normal"])
def test_distribution_likelihood_and_quantiles_are_the_distributions(name):
    objective = DistributionObjective(name, LEVELS)
    params = torch.randn(4, 5, objective.width, dtype=torch.float64) * 2
    true = torch.randn(4, 5, dtype=torch.float64)
    loc, scale, df = objective.parameters(params)
    law = (stats.t(df.double().numpy(), loc.double().numpy(), scale.double().numpy()) if name == "studentt"
           else stats.norm(loc.double().numpy(), scale.double().numpy()))
    np.testing.assert_allclose(objective.loss_elements(params, true).numpy(), -law.logpdf(true.numpy()), rtol=1e-5)
    quantiles = objective.quantiles(params).numpy()
    np.testing.assert_allclose(quantiles, np.stack([law.ppf(q) for q in LEVELS], -1), rtol=1e-5, atol=1e-6)


def _documented_parameters(name, raw):
    """(loc, scale, df) from raw outputs [..., width] by docs/probabilistic.md's map, in numpy float64, written here
    without the objective: scale = softplus(raw1) + 1e-6, df = 2 + softplus(raw2) (a finite variance)."""
    raw = np.asarray(raw, dtype=np.float64)
    softplus = lambda v: np.logaddexp(0.0, v)  # noqa: E731
    return raw[..., 0], softplus(raw[..., 1]) + 1e-6, (2.0 + softplus(raw[..., 2])) if name == "studentt" else None


def _law(name, loc, scale, df):
    return stats.t(df, loc, scale) if name == "studentt" else stats.norm(loc, scale)


def _raw_parameters(width, seed, shape=(4, 6, 2)):
    """Raw outputs around 0, where softplus and exp differ most, and at its ends (-30, 30)."""
    raw = torch.randn(*shape, width, generator=torch.Generator().manual_seed(seed)) * 1.5
    raw[0, 0, 0, 1:] = -30.0
    raw[0, 1, 0, 1:] = 30.0
    return raw


@pytest.mark.parametrize("name", ["studentt", "normal"])
def test_distribution_parameters_likelihood_and_quantiles_follow_the_documented_map(name):
    """The map from a model's raw outputs to the distribution's parameters, pinned against an independent numpy /
    scipy computation (not the objective's own parameters): the loss trained on, the exact quantiles and, with
    --num_samples, the sampled ones scored are those of t(df, loc, scale) / N(loc, scale) with scale = softplus +
    1e-6 and df = 2 + softplus. Planted: the scale through exp instead of softplus + 1e-6 fails here."""
    from utils.probabilistic import SampleStream

    objective = DistributionObjective(name, LEVELS)
    raw = _raw_parameters(objective.width, seed=11)
    true = torch.randn(raw.shape[:-1], generator=torch.Generator().manual_seed(12)) * 2
    loc, scale, df = _documented_parameters(name, raw.numpy())
    got = objective.parameters(raw)
    np.testing.assert_allclose(got[0].numpy(), loc, rtol=1e-6)
    np.testing.assert_allclose(got[1].numpy(), scale, rtol=1e-6)
    if name == "studentt":
        np.testing.assert_allclose(got[2].numpy(), df, rtol=1e-6)
    assert (got[2] is None) == (name == "normal")
    law = _law(name, loc, scale, df)
    np.testing.assert_allclose(objective.loss_elements(raw, true).numpy(), -law.logpdf(true.numpy()), rtol=1e-5,
                               atol=1e-5)
    assert objective.loss(raw, true).item() == pytest.approx(-law.logpdf(true.numpy()).mean(), rel=1e-5)
    exact = np.stack([law.ppf(q) for q in LEVELS], -1)
    np.testing.assert_allclose(objective.quantiles(raw).numpy(), exact, rtol=1e-5, atol=1e-6)
    # sampled: each window's uniforms from its key's stream, through the documented law's inverse CDF
    sampled = DistributionObjective(name, LEVELS, samples=64)
    keys = window_keys(7, "test", range(raw.shape[0]))
    uniforms = SampleStream(keys, 64, raw.shape[1:-1], torch.device("cpu")).uniforms().numpy()  # [B, N, P, C]
    draws = loc[:, None] + scale[:, None] * (stats.t.ppf(uniforms, df[:, None]) if name == "studentt"
                                             else stats.norm.ppf(uniforms))
    expected = np.moveaxis(np.quantile(draws, LEVELS, axis=1), 0, -1)
    np.testing.assert_allclose(sampled.quantiles(raw, keys).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("samples", [[], ["--num_samples", 32]])
def test_a_studentt_runs_scored_quantiles_are_the_documented_laws(samples):
    """DLinear --loss studentt, its raw widened output on test windows: the quantiles the test scores (the median
    returned, WQL, sMAPE and coverage) and the objective loss equal those of the documented law computed here with
    scipy from the raw output (sampled: each window's uniforms from window_keys(seed, "test", its number)).
    Planted: the scale through exp fails here."""
    from data_provider.data_factory import data_provider, split_numbering
    from exp.forward import forward
    from exp.scoring import ProbabilisticScoring
    from utils.metrics import ProbabilisticSums
    from utils.probabilistic import SampleStream

    exp = make_experiment(make_args("--model", "DLinear", *SMALL, "--loss", "studentt", "--quantiles", "0.1,0.5,0.9",
                                    "--num_threads", 1, *samples))
    dataset = data_provider(exp.args, "test")[0]
    picks = torch.tensor([0, 7, len(dataset) - 1])
    with torch.no_grad():
        raw, true = forward(exp.raw_model.eval(), dataset.__getitems__(picks), exp.args, "test", exp.device)
    loc, scale, df = _documented_parameters("studentt", raw.numpy())
    levels = (0.1, 0.5, 0.9)
    if samples:
        numbers = split_numbering(dataset)[0][picks.numpy()]
        uniforms = SampleStream(window_keys(exp.args.seed, "test", numbers), 32, raw.shape[1:-1],
                                torch.device("cpu")).uniforms().numpy()
        draws = loc[:, None] + scale[:, None] * stats.t.ppf(uniforms, df[:, None])
        expected = np.moveaxis(np.quantile(draws, levels, axis=1), 0, -1)
    else:
        expected = np.stack([stats.t.ppf(q, df, loc, scale) for q in levels], -1)
    scoring = ProbabilisticScoring(exp.args, dataset, exp.device)
    median = scoring.update(raw, true, picks)
    np.testing.assert_allclose(median.numpy(), expected[..., 1], rtol=1e-5, atol=1e-6)
    reference = ProbabilisticSums(levels)
    reference.update(torch.from_numpy(expected), true.double())
    mine, theirs = scoring.metrics(), reference.metrics()
    for key in ("wql", "smape", "coverage_80"):
        assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-9), key
    nll = -stats.t.logpdf(true.numpy(), df, loc, scale)
    assert exp.objective.loss(raw, true).item() == pytest.approx(nll.mean(), rel=1e-5)


def test_quantiles_never_cross():
    """A quantile head's raw outputs may cross (nothing in training orders them); what is scored is sorted.
    Planted: quantiles() returning the raw parameters fails here."""
    objective = QuantileObjective(LEVELS)
    raw = torch.randn(8, 6, 3, len(LEVELS))
    raw[..., :] = raw.flip(-1).sort(-1, descending=True).values  # every element's levels crossed
    quantiles = objective.quantiles(raw)
    assert (quantiles.diff(dim=-1) >= 0).all()
    torch.testing.assert_close(quantiles, raw.sort(-1).values)  # the same values, in order
    assert torch.equal(objective.point(raw), quantiles[..., LEVELS.index(0.5)])
    for name in ("studentt", "normal"):  # the inverse CDF is monotone, at extreme parameters too
        extreme = torch.tensor([[-1e4, 30.0, -30.0], [0.0, -30.0, 30.0], [5.0, 0.0, -10.0]])
        distribution = DistributionObjective(name, LEVELS)
        assert (distribution.quantiles(extreme[:, :distribution.width]).diff(dim=-1) >= 0).all()


# Student-t's inverse CDF is computed on the tensors' device (utils.probabilistic.student_t_icdf); scipy's stdtrit is
# the reference. Agreement: |ours - scipy| <= 1e-6 max(1, |scipy|), relative where |t| >= 1 and absolute below
# (stdtrit itself is off by 4e-5 relative at p 0.500001). Every level of GIFT-Eval and of --quantiles' default,
# the tails a sample may reach (2^-53: torch.rand's smallest step), small df (1, 2, 2.5), large ones (the
# expansion from 1e4).
T_DFS = (1.0, 1.5, 2.0, 2.0001, 2.5, 3.0, 4.0, 5.0, 7.3, 10.0, 30.0, 100.0, 1e3, 9999.0, 1e4, 1e5, 1e6)
T_LEVELS = sorted({2.0 ** -53, 1e-12, 1e-8, 1e-4, 0.001, 0.01, 0.025, *DEFAULT_LEVELS, *GIFT_EVAL_LEVELS, 0.499999,
                   0.5, 0.500001, 0.99, 0.999, 1 - 1e-8, 1 - 2.0 ** -53, *np.linspace(0.001, 0.999, 37).tolist()})


def test_student_t_quantiles_are_scipys_at_every_df_and_level():
    """Planted: 8 continued-fraction terms instead of (20, 40), or the tail start without its power 1/a: fails."""
    from scipy.special import stdtrit

    p, df = np.meshgrid(np.array(T_LEVELS), np.array(T_DFS))
    ours = student_t_icdf(torch.from_numpy(p), torch.from_numpy(df)).numpy()
    reference = stdtrit(df, p)
    worst = np.abs(ours - reference) / np.maximum(1.0, np.abs(reference))
    i = np.unravel_index(worst.argmax(), worst.shape)
    assert worst.max() <= 1e-6, f"df {df[i]}, p {p[i]}: {ours[i]} against scipy's {reference[i]}"
    assert (ours[:, np.array(T_LEVELS) == 0.5] == 0).all()


def test_student_t_quantiles_at_the_ends_and_on_any_layout():
    """A value does not depend on its neighbours (a window's quantiles on its batch): the same bits alone, in
    sevens and in one tensor; p 0 and 1 are -inf and inf, NaN stays NaN, the smallest positive p is finite."""
    g = torch.Generator().manual_seed(5)
    p = torch.rand(3001, generator=g, dtype=torch.float64)
    df = 2 + torch.nn.functional.softplus(torch.randn(3001, generator=g, dtype=torch.float64) * 4)
    together = student_t_icdf(p, df)
    assert torch.equal(together[:300], torch.cat([student_t_icdf(p[i:i + 1], df[i:i + 1]) for i in range(300)]))
    assert torch.equal(together, torch.cat([student_t_icdf(p[i:i + 7], df[i:i + 7]) for i in range(0, 3001, 7)]))
    ends = torch.tensor([0.0, 1.0, float("nan"), torch.finfo(torch.float64).tiny], dtype=torch.float64)
    got = student_t_icdf(ends, torch.tensor(2.5, dtype=torch.float64))
    assert got[0] == -math.inf and got[1] == math.inf and got[2].isnan()
    assert torch.isfinite(got[3]) and got[3] < -1e120  # t^-2.5 tail: about -1.0e123
    assert student_t_icdf(torch.zeros(0, 3, dtype=torch.float64), torch.ones(3)).shape == (0, 3)


ASYMMETRIC = (0.1, 0.5, 0.6, 0.9)  # a median that is not the middle of the levels: reversing them moves it


def _crossed(shape, seed):
    """[..., L] parameters whose levels cross, each element in its own random order (a reversal of symmetric
    levels keeps the median's block in place and hides a median read before sorting)."""
    generator = torch.Generator().manual_seed(seed)
    ordered = torch.randn(*shape, generator=generator).cumsum(-1)  # increasing along the levels
    order = torch.rand(*shape, generator=generator).argsort(-1)  # each element's levels shuffled
    return ordered.gather(-1, order)


def test_the_point_forecast_is_the_median_of_the_sorted_levels():
    """What validation scores and a rollout feeds back is the median of the element's sorted quantiles, not the raw
    0.5 block. Planted: point() reading params[..., levels.index(0.5)] before sorting fails here."""
    objective = QuantileObjective(ASYMMETRIC)
    raw = _crossed((6, 5, 3, len(ASYMMETRIC)), seed=3)
    expected = np.sort(raw.numpy(), axis=-1)[..., ASYMMETRIC.index(0.5)]  # the second smallest of four
    assert (raw[..., ASYMMETRIC.index(0.5)].numpy() != expected).mean() > 0.4  # the raw block is often not it
    np.testing.assert_array_equal(objective.point(raw).numpy(), expected)


def test_validation_scores_the_sorted_median():
    """The validation split's MSE and MAE (the point metrics of evaluate()) are the sorted median's, computed here
    from the model's raw widened output with numpy, at asymmetric levels. Planted: the median read from the
    unsorted 0.5 block fails here."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward

    exp = make_experiment(make_args("--model", "DLinear", *SMALL, "--loss", "quantile", "--quantiles",
                                    ",".join(map(str, ASYMMETRIC)), "--num_threads", 1))
    weight = exp.raw_model.Linear_Seasonal.weight  # DLinear starts every block alike (1 / seq_len): no crossing
    with torch.no_grad():  # random weights: blocks that cross, as a badly trained head's do
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(5)) / 10)
    loader = data_provider(exp.args, "val")[1]
    dataset = loader.dataset
    with torch.no_grad():
        pred, true = forward(exp.raw_model.eval(), dataset.__getitems__(torch.arange(len(dataset))), exp.args, "val",
                             exp.device)
    raw, truth = pred.double().numpy(), true.double().numpy()
    median = np.sort(raw, axis=-1)[..., ASYMMETRIC.index(0.5)]
    assert (raw[..., ASYMMETRIC.index(0.5)] != median).mean() > 0.2
    metrics = exp.evaluate(loader, "val").metrics()
    assert metrics["mse"] == pytest.approx(np.mean((median - truth) ** 2), rel=1e-6)
    assert metrics["mae"] == pytest.approx(np.mean(np.abs(median - truth)), rel=1e-6)


def test_a_token_models_rollout_feeds_back_the_sorted_median():
    """TimerXL --loss quantile rolls out 36 steps in three of 12: each step's input ends with the previous step's
    forecast, which is the median of its sorted levels (read here from the model's own output, block k of the
    widened token the k-th level). Planted: the rollout feeding back the unsorted 0.5 block fails here."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward

    exp = make_experiment(make_args(*SMALL_TIMERXL, "--data", "synthetic", "--synthetic_rows", 1000,
                                    "--synthetic_channels", 2, "--seq_len", 48, "--input_token_len", 12,
                                    "--output_token_len", 12, "--test_pred_len", 36, "--loss", "quantile",
                                    "--quantiles", ",".join(map(str, ASYMMETRIC)), "--num_threads", 1))
    width, out_len = len(ASYMMETRIC), 12
    inputs, outputs = [], []
    exp.raw_model.register_forward_pre_hook(lambda module, args: inputs.append(args[0].clone()))
    exp.raw_model.register_forward_hook(lambda module, args, out: outputs.append(out.clone()))
    dataset = data_provider(exp.args, "test")[0]
    with torch.no_grad():
        pred, _ = forward(exp.raw_model.eval(), dataset.__getitems__(torch.arange(4)), exp.args, "test", exp.device)
    assert len(inputs) == 3 and pred.shape == (4, 36, 2, width)
    for step in range(2):
        last = outputs[step][:, -out_len * width:].numpy()  # the last token's widened output: width blocks
        blocks = last.reshape(4, width, out_len, 2)
        median = np.sort(blocks, axis=1)[:, ASYMMETRIC.index(0.5)]
        assert (blocks[:, ASYMMETRIC.index(0.5)] != median).mean() > 0.2  # the raw 0.5 block is often not it
        np.testing.assert_array_equal(inputs[step + 1][:, -out_len:].numpy(), median)
        np.testing.assert_array_equal(pred[:, step * out_len:(step + 1) * out_len].numpy(), blocks.transpose(0, 2, 3, 1))


# ------------------------------------------------------------------ samples that follow the window
def test_a_windows_samples_do_not_depend_on_its_batch_or_the_number_of_samples():
    keys = window_keys(2021, "test", [3, 5, 9])
    together = SampleStream(keys, 8, (4, 2), torch.device("cpu")).uniforms()
    alone = SampleStream(window_keys(2021, "test", [5]), 8, (4, 2), torch.device("cpu")).uniforms()
    fewer = SampleStream(window_keys(2021, "test", [5]), 3, (4, 2), torch.device("cpu")).uniforms()
    assert torch.equal(together[1], alone[0])
    assert torch.equal(fewer[0], alone[0, :3])  # sample s is the s-th draw of its window's stream
    assert not torch.equal(together[0], together[1])
    assert window_keys(2021, "test", [5]) != window_keys(2022, "test", [5]) != window_keys(2021, "val", [5])


def test_sampled_quantiles_are_numpys_and_follow_the_window():
    draws = torch.randn(3, 50, 4, 2, dtype=torch.float64)
    np.testing.assert_allclose(sample_quantiles(draws, LEVELS).numpy(),
                               np.moveaxis(np.quantile(draws.numpy(), LEVELS, axis=1), 0, -1), rtol=1e-12)
    objective = DistributionObjective("studentt", LEVELS, samples=20)
    params = torch.randn(3, 4, 2, 3)
    batch = objective.quantiles(params, window_keys(1, "test", [10, 11, 12]))
    for i in range(3):
        one = objective.quantiles(params[i:i + 1], window_keys(1, "test", [10 + i]))
        assert torch.equal(one[0], batch[i])


# ------------------------------------------------------------------ every model, either objective
@pytest.mark.parametrize("loss", ["quantile", "studentt"])
@pytest.mark.parametrize("model", ZOO)
def test_every_zoo_model_trains_with_either_objective(model, loss):
    from test_model_contract import CONTRACT_ARGS, first_windows

    from exp.forward import forward

    exp = make_experiment(make_args("--model", model, *CONTRACT_ARGS, "--loss", loss, "--quantiles", "0.1,0.5,0.9"))
    width = exp.objective.width
    batch = first_windows(exp, "train", 4)
    exp.raw_model.train()
    pred, true = forward(exp.raw_model, batch, exp.args, "train", exp.device)
    assert pred.shape == (*true.shape, width)
    loss_value = exp.loss(pred, true)
    loss_value.backward()
    assert torch.isfinite(loss_value)
    grads = [p.grad for p in exp.raw_model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    with torch.no_grad():
        exp.raw_model.eval()
        pred, true = forward(exp.raw_model, first_windows(exp, "test", 4), exp.args, "test", exp.device)
    assert pred.shape == (*true.shape, width)


class FixedHorizon(nn.Module):
    """A model whose horizon is its own (96 steps), whatever configs.pred_len says."""

    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        self.linear = nn.Linear(configs.seq_len, 24)

    def forward(self, x_enc, *unused):
        return self.linear(x_enc.transpose(1, 2)).transpose(1, 2)


class BlockCoded(nn.Module):
    """A direct model whose widened output states its own position: step j of the widened horizon, channel c,
    holds j + c / 100, so block k (steps k * pred_len ...) step t reads back as k * pred_len + t + c / 100."""

    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        self.horizon = configs.pred_len  # pred_len x width: the experiment widened it
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, x_enc, *unused):
        batch, _, channels = x_enc.shape
        coded = torch.arange(self.horizon, dtype=x_enc.dtype)[:, None] + torch.arange(channels) / 100
        return coded.expand(batch, -1, -1) + 0 * self.unused


class TokenCoded(nn.Module):
    """A token model whose widened output states its own position: token i's step j (of output_token_len x width),
    channel c, holds 1000 i + j + c / 100."""

    autoregressive = True
    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        self.token, self.out_len = configs.input_token_len, configs.output_token_len  # widened
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, x_enc, *unused):
        batch, length, channels = x_enc.shape
        tokens = length // self.token
        coded = (1000 * torch.arange(tokens, dtype=x_enc.dtype)[:, None, None]
                 + torch.arange(self.out_len, dtype=x_enc.dtype)[None, :, None] + torch.arange(channels) / 100)
        return coded.reshape(1, tokens * self.out_len, channels).expand(batch, -1, -1) + 0 * self.unused


def test_a_widened_output_is_read_as_one_block_per_parameter():
    """The widened horizon is `width` blocks of the horizon, block k parameter k (level k) of every step: read
    back from models that write each value's position, for a direct model, a token model's every token (training)
    and its roll-out (test), with --loss quantile and studentt. Planted: the blocks read step-major (the width
    values of a step side by side) fails here."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward

    c = torch.arange(2) / 100
    for loss in (["--loss", "quantile", "--quantiles", "0.1,0.5,0.9"], ["--loss", "studentt"]):
        with mock.patch("exp.settings.get_model_class", return_value=BlockCoded):
            exp = make_experiment(make_args("--model", "BlockCoded", *SMALL, "--synthetic_channels", 2, *loss))
        batch = data_provider(exp.args, "test")[0].__getitems__(torch.arange(2))
        pred, _ = forward(exp.raw_model, batch, exp.args, "test", exp.device)
        width = exp.objective.width
        k, t = torch.arange(width), torch.arange(24)
        expected = k * 24 + t[:, None, None] + c[:, None]  # [t, c, k]
        torch.testing.assert_close(pred, expected.expand(2, -1, -1, -1), rtol=0, atol=1e-4)

    token = ["--seq_len", 48, "--input_token_len", 12, "--output_token_len", 12, "--test_pred_len", 24]
    with mock.patch("exp.settings.get_model_class", return_value=TokenCoded):
        exp = make_experiment(make_args("--model", "TokenCoded", *SMALL, "--synthetic_channels", 2, *token,
                                        "--loss", "quantile", "--quantiles", "0.1,0.5,0.9"))
    k, s = torch.arange(3), torch.arange(12)
    batch = data_provider(exp.args, "train")[0].__getitems__(torch.arange(2))
    pred, _ = forward(exp.raw_model, batch, exp.args, "train", exp.device)  # [B, tokens, out_len, C, width]
    expected = 1000 * torch.arange(4)[:, None, None, None] + k * 12 + s[:, None, None] + c[:, None]
    torch.testing.assert_close(pred, expected.expand(2, -1, -1, -1, -1), rtol=0, atol=1e-3)
    batch = data_provider(exp.args, "test")[0].__getitems__(torch.arange(2))
    pred, _ = forward(exp.raw_model, batch, exp.args, "test", exp.device)  # two roll-out steps of the last token
    last = 1000 * 3 + k * 12 + s[:, None, None] + c[:, None]
    torch.testing.assert_close(pred, torch.cat([last, last]).expand(2, -1, -1, -1), rtol=0, atol=1e-3)


def test_a_single_quantile_level_is_read_as_one_block():
    """--quantiles 0.5 alone: a width of one is still a block, [..., C, 1], for a direct model, a token model's
    tokens and its roll-out (which feeds back that block). Was: the [..., C] output taken for the parameters, and a
    shape RuntimeError at the first training step."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward

    c, t = torch.arange(2) / 100, torch.arange(24)
    with mock.patch("exp.settings.get_model_class", return_value=BlockCoded):
        exp = make_experiment(make_args("--model", "BlockCoded", *SMALL, "--synthetic_channels", 2, "--loss",
                                        "quantile", "--quantiles", "0.5"))
    batch = data_provider(exp.args, "train")[0].__getitems__(torch.arange(2))
    pred, true = forward(exp.raw_model, batch, exp.args, "train", exp.device)
    torch.testing.assert_close(pred, (t[:, None, None] + c[:, None]).expand(2, -1, -1, 1), rtol=0, atol=1e-4)
    assert exp.loss(pred, true).dim() == 0

    token = ["--seq_len", 48, "--input_token_len", 12, "--output_token_len", 12, "--test_pred_len", 24]
    with mock.patch("exp.settings.get_model_class", return_value=TokenCoded):
        exp = make_experiment(make_args("--model", "TokenCoded", *SMALL, "--synthetic_channels", 2, *token,
                                        "--loss", "quantile", "--quantiles", "0.5"))
    s = torch.arange(12)
    batch = data_provider(exp.args, "train")[0].__getitems__(torch.arange(2))
    pred, _ = forward(exp.raw_model, batch, exp.args, "train", exp.device)  # [B, tokens, out_len, C, 1]
    expected = 1000 * torch.arange(4)[:, None, None, None] + s[:, None, None] + c[:, None]
    torch.testing.assert_close(pred, expected.expand(2, -1, -1, -1, -1), rtol=0, atol=1e-3)
    batch = data_provider(exp.args, "test")[0].__getitems__(torch.arange(2))
    pred, _ = forward(exp.raw_model, batch, exp.args, "test", exp.device)
    last = 1000 * 3 + s[:, None] + c
    torch.testing.assert_close(pred, torch.cat([last, last])[..., None].expand(2, -1, -1, 1), rtol=0, atol=1e-3)


def test_a_run_at_the_single_level_0_5_trains_and_is_scored(tmp_path):
    """run.py --loss quantile --quantiles 0.5 (every documented rule met) trains and scores: its objective is the
    pinball loss at 0.5, half the median's absolute error, so the recorded test_objective_loss is half the mae;
    wql and mase are reported, and no coverage or msis (they need interval ends)."""
    assert_ok(run_cli(tmp_path, "--model", "DLinear", *SMALL, "--loss", "quantile", "--quantiles", "0.5",
                      "--train_epochs", 1, "--num_threads", 1))
    record = records(tmp_path)[-1]
    assert record["test_objective_loss"] == pytest.approx(record["mae"] / 2, rel=1e-5)
    assert record["wql_levels"] == [0.5] and record["wql"] > 0 and record["mase"] > 0
    assert not any(key.startswith(("coverage", "msis")) for key in record)


def _build_fixed_horizon(rank, world_size):
    from utils.errors import UserError

    with mock.patch("exp.settings.get_model_class", return_value=FixedHorizon):
        try:
            make_experiment(make_args("--model", "FixedHorizon", *SMALL, "--loss", "studentt"))
        except UserError as problem:
            return str(problem)
    return None


def test_a_model_that_cannot_widen_its_output_is_refused_in_one_line_on_every_rank():
    expected = ("--loss studentt needs 3 values a step, asked of model FixedHorizon as a 3 times longer pred_len, "
                "but it returned 24 steps for 72: its output does not follow configs.pred_len; train it with --loss "
                "MSE or MAE, or have its output length follow that argument")
    assert _build_fixed_horizon(0, 1) == expected
    assert run_on_ranks(_build_fixed_horizon, 2) == [expected] * 2


def test_validation_loss_is_the_objectives():
    """Early stopping follows the training objective: vali() is the pinball loss over every validation
    element, not the median's MSE."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward

    exp = make_experiment(make_args("--model", "DLinear", *SMALL, "--loss", "quantile", "--eval_batch_size", 7))
    loader = data_provider(exp.args, "val")[1]
    dataset = loader.dataset
    with torch.no_grad():
        pred, true = forward(exp.raw_model, dataset.__getitems__(torch.arange(len(dataset))), exp.args, "val",
                             exp.device)
    expected = exp.objective.loss_elements(pred, true).double().mean().item()
    assert exp.vali(loader) == pytest.approx(expected, rel=1e-6)
    assert exp.vali(loader) != pytest.approx(((exp.objective.point(pred) - true) ** 2).mean().item(), rel=1e-3)


# ------------------------------------------------------------------ end to end, any world size
METRICS = ("vali_loss", "test_objective_loss", "mse", "mae", "wql", "mase", "smape", "msis",
           "coverage_50", "coverage_80", "coverage_90")
CASES = {
    "quantile": ["--model", "DLinear", *SMALL, "--loss", "quantile"],
    "studentt-sampled": ["--model", "DLinear", *SMALL, "--loss", "studentt", "--num_samples", 16],
}


@pytest.mark.parametrize("case", list(CASES))
def test_probabilistic_metrics_are_the_same_on_1_2_3_processes_and_two_eval_batch_sizes(tmp_path, case):
    """One checkpoint scored on 1, 2 and 3 processes and at --eval_batch_size 5: the same quantiles (sampled
    ones too) give the same metrics. Planted: window_keys keyed by the rank, or a MASE scale from each window's
    input instead of its series' history: this test fails."""
    argv = CASES[case]
    assert_ok(run_cli(tmp_path, *argv, "--train_epochs", 1))
    trained = records(tmp_path)[-1]
    checkpoint = tmp_path / "checkpoints" / trained["setting"] / "checkpoint.pth"
    scored = []
    for nproc, batch in ((1, []), (2, []), (3, []), (1, ["--eval_batch_size", 5])):
        ddp = ["--ddp"] if nproc > 1 else []
        assert_ok(run_cli(tmp_path, *argv, *batch, *ddp, "--is_training", 0, "--checkpoint", checkpoint,
                          nproc=nproc if nproc > 1 else None))
        scored.append(records(tmp_path)[-1])
        assert scored[-1]["world_size"] == nproc
    for record in [trained, *scored[1:]]:
        for key in METRICS:
            assert record[key] == pytest.approx(scored[0][key], rel=1e-9, abs=1e-12), (key, record["world_size"])
    assert 0 < scored[0]["coverage_50"] < scored[0]["coverage_80"] < scored[0]["coverage_90"] <= 1
    assert scored[0]["wql_levels"] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def test_a_quantile_run_at_asymmetric_levels_learns_its_levels_and_reports_their_pinball_loss(tmp_path):
    """run.py trains DLinear on the pinball loss at 0.5, 0.8 and 0.9 (no level mirrors another, so a level trained
    as its mirror cannot hide in the sorting, as it does among symmetric levels), 2 epochs: on the test windows about
    50, 80 and 90 % of the truths lie at or below the quantiles of those levels (measured 46, 80, 87 %), and the
    recorded test_objective_loss is the pinball loss of the raw outputs computed here with numpy. Planted: tau
    flipped in the pinball loss (1 - tau for tau) fails here (the default symmetric levels hide it in every metric)."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward
    from utils.checkpoint import load_weights

    levels = (0.5, 0.8, 0.9)
    argv = ["--model", "DLinear", *SMALL, "--loss", "quantile", "--quantiles", ",".join(map(str, levels)),
            "--learning_rate", 0.01, "--num_threads", 1]
    assert_ok(run_cli(tmp_path, *argv, "--train_epochs", 2))
    record = records(tmp_path)[-1]
    exp = make_experiment(make_args(*argv, "--is_training", 0))
    load_weights(exp.raw_model, tmp_path / "checkpoints" / record["setting"] / "checkpoint.pth")
    dataset = data_provider(exp.args, "test")[0]
    with torch.no_grad():
        raw, true = forward(exp.raw_model.eval(), dataset.__getitems__(torch.arange(len(dataset))), exp.args, "test",
                            exp.device)
    raw, truth = raw.double().numpy(), true.double().numpy()
    error = truth[..., None] - raw  # level k's block against the truth: tau (y - q) above, (1 - tau) (q - y) below
    pinball = np.where(error >= 0, np.array(levels) * error, (np.array(levels) - 1) * error)
    assert record["test_objective_loss"] == pytest.approx(pinball.mean(), rel=1e-6)
    below = [(truth <= np.sort(raw, axis=-1)[..., k]).mean() for k in range(len(levels))]
    assert below == pytest.approx(levels, abs=0.12), below


def test_default_levels_hold_gift_evals_nine_and_the_interval_ends():
    from utils.arguments import parser_defaults

    levels = parse_levels(parser_defaults()["quantiles"])
    assert {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.05, 0.95, 0.25, 0.75} == set(levels)


# ------------------------------------------------------------------ MASE's scale: the series', once
def test_every_window_of_a_series_gets_its_whole_historys_scale():
    """MASE divides by the in-sample seasonal naive error of the series' history before the test split
    (season 24 at --freq h), the same for every window. Planted: a scale from each window's own input (or
    from a rank's share) fails here or in the world-size test above."""
    from data_provider.data_factory import data_provider, prepared_data
    from exp.scoring import series_scales

    exp = make_experiment(make_args("--model", "DLinear", *SMALL, "--loss", "quantile"))
    data = prepared_data(exp.args)
    history = data.values[:data.ends[1]].astype(np.float64)  # every row before the first test forecast
    expected = np.abs(history[24:] - history[:-24]).mean(0)
    scales = series_scales(exp.args).numpy()
    assert scales.shape == (len(data_provider(exp.args, "test")[0]), 7)
    np.testing.assert_allclose(scales, np.broadcast_to(expected, scales.shape), rtol=1e-12)


def test_a_corpus_series_scale_comes_from_its_own_history():
    from data_provider.univariate import UnivariateData
    from data_provider.windows import Window

    rng = np.random.default_rng(0)
    series = [rng.standard_normal(200).astype(np.float32), 5 * rng.standard_normal(300).astype(np.float32)]
    data = UnivariateData(series, [[140, 160, 200], [210, 240, 300]])
    window = Window(24, 24, 12)
    histories, of_window = data.series_histories("test", window)
    assert len(of_window) == len(data.window_dataset("test", window))
    # a series' test rows start one input early: (test rows + 24) - span 36 + 1 windows each
    assert list(np.bincount(of_window)) == [40 + 24 - 36 + 1, 60 + 24 - 36 + 1]
    for history, values, ends in zip(histories, series, data.ends):
        np.testing.assert_array_equal(history[:, 0], values[:ends[1]].astype(np.float64))


# ------------------------------------------------------------------ a model that forecasts its own quantiles
class NativeQuantiles(nn.Module):
    """A quantile forecaster of its own (as a released foundation model is): [B, pred_len, C, 3]."""

    inputs_used = ("x_enc",)
    quantile_levels = (0.1, 0.5, 0.9)

    def __init__(self, configs):
        super().__init__()
        self.pred_len = configs.pred_len
        self.linear = nn.Linear(configs.seq_len, configs.pred_len * 3)

    def forward(self, x_enc, *unused):
        batch, _, channels = x_enc.shape
        out = self.linear(x_enc.transpose(1, 2)).view(batch, channels, self.pred_len, 3)
        return out.permute(0, 2, 1, 3)


def _native(*extra, model=NativeQuantiles):
    with mock.patch("exp.settings.get_model_class", return_value=model):
        return make_experiment(make_args("--model", "NativeQuantiles", *SMALL, *extra))


def test_a_model_forecasting_its_own_quantiles_is_scored_and_trained_at_them():
    """No widening: its output is read as its levels, it trains on the pinball loss over them, whatever
    --loss said, and validation follows that loss."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward

    exp = _native()
    assert (exp.args.loss, exp.args.quantiles, exp.args.native_quantiles) == ("quantile", "0.1,0.5,0.9", [0.1, 0.5, 0.9])
    assert exp.raw_model.linear.out_features == 24 * 3  # pred_len as asked: not widened
    batch = data_provider(exp.args, "train")[0].__getitems__(torch.arange(4))
    pred, true = forward(exp.raw_model, batch, exp.args, "train", exp.device)
    assert pred.shape == (*true.shape, 3)
    exp.loss(pred, true).backward()
    ms = _native("--features", "MS")
    pred, true = forward(ms.raw_model, batch, ms.args, "train", ms.device)
    assert pred.shape == (4, 24, 1, 3) and true.shape == (4, 24, 1)  # the target's quantiles
    assert np.isfinite(exp.vali(data_provider(exp.args, "val")[1]))


def test_a_quantile_models_levels_and_loss_are_its_own():
    from utils.errors import UserError

    assert _native("--quantiles", "0.1,0.5,0.9").args.quantiles == "0.1,0.5,0.9"
    with pytest.raises(UserError, match=r"^model NativeQuantiles forecasts the quantiles 0.1,0.5,0.9 itself; "
                                        r"--quantiles 0.2,0.5,0.8 asks for others: leave --quantiles out$"):
        _native("--quantiles", "0.2,0.5,0.8")
    with pytest.raises(UserError, match=r"^model NativeQuantiles forecasts quantiles \(0.1,0.5,0.9\), not a "
                                        r"distribution: --loss studentt cannot train it"):
        _native("--loss", "studentt")

    class Unsorted(NativeQuantiles):
        quantile_levels = (0.9, 0.5, 0.1)

    with pytest.raises(UserError, match=r"Model.quantile_levels = \(0.9, 0.5, 0.1\): declare the levels"):
        _native(model=Unsorted)

    class WrongShape(NativeQuantiles):
        def forward(self, x_enc, *unused):
            return super().forward(x_enc)[..., 0]

    with pytest.raises(UserError, match=r"declares quantile_levels \(3 levels\), so its forward must return "
                                        r"\[B, pred_len, C, 3\]; it returned \(1, 24, 7\)"):
        _native(model=WrongShape)
