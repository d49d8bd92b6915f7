"""--model Ensemble --members A,B,... (exp/ensemble.py builds the members, models/Ensemble.py combines them).

- the same scores on 1, 2 and 3 processes and at two --eval_batch_size, over three release fixtures (random weights,
  written by tests/test_foundation.py's rows) and a checkpoint DLinear trained here;
- each member forecasts as its own zero-shot run does, each runs once per batch, and the ensemble is the median
  (or, --ensemble_rule mean, the mean) of their quantiles at each level, a point member joining the median only;
- levels reconciled by the documented rule, and every bad --members one line (tests/bad_inputs.py runs them
  through run.py on 1 and 2 processes).
"""
import argparse
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import test_foundation as foundation
from helpers import ETTH1_ARGS, assert_ok, make_args, make_experiment, records, run_cli, write_etth1_shaped

SHAPES = ("--seq_len", 64, "--pred_len", 24, "--label_len", 0)
RUN = (*SHAPES, "--val_windows", 12, "--test_windows", 20, "--num_threads", 1)
# three releases that forecast GIFT-Eval's nine levels, picked by that property from the foundation table
LEVELS_9 = tuple(foundation.LEVELS_9)


def release_rows(count=3):
    """`count` finished release rows whose quantiles are the nine levels and whose package (if any) is installed,
    fastest fixtures first (those committed or written without a package: no import of one)."""
    import importlib.util

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    # finished releases (their cross-check result committed) forecasting the nine levels, taking the shared context
    rows = [row for row in foundation.RELEASES.values() if tuple(row.levels) == LEVELS_9
            and (results / f"foundation_{row.name}.md").is_file()
            and (not row.package or importlib.util.find_spec(row.package.split(".")[0]) is not None)
            and "--num_samples" not in row.run and int(row.run[1]) >= 64]  # takes the shared context
    rows.sort(key=lambda row: bool(row.package))
    if len(rows) < count:
        pytest.skip(f"fewer than {count} release fixtures forecasting nine levels can be written here")
    return rows[:count]


def fake_checkpoint(folder, seq_len=64, pred_len=24, loss="MSE", quantiles=None, model="DLinear"):
    """checkpoint.pth of a DLinear (random weights) with the training record a run writes beside it (last.pth:
    its run identity, here the fields an ensemble member reads)."""
    from models import get_model_class
    from utils.probabilistic import parse_levels

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    width = 1 if loss == "MSE" else len(parse_levels(quantiles))
    configs = argparse.Namespace(seq_len=seq_len, pred_len=pred_len * width, enc_in=7, individual=False, moving_avg=25)
    torch.manual_seed(0)
    torch.save(get_model_class(model)(configs).state_dict(), folder / "checkpoint.pth")
    identity = {"model": model, "seq_len": seq_len, "pred_len": pred_len, "label_len": 0, "loss": loss,
                "quantiles": quantiles or "0.05,0.1,0.2,0.25,0.3,0.4,0.5,0.6,0.7,0.75,0.8,0.9,0.95",
                "moving_avg": 25, "individual": False}
    torch.save({"identity": identity}, folder / "last.pth")
    return folder / "checkpoint.pth"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble")
    data = write_etth1_shaped(root / "data")
    folders = [row.write(root / "releases" / row.name / row.dirname) for row in release_rows()]
    trained = root / "trained"
    assert_ok(run_cli(trained, *ETTH1_ARGS, "--root_path", data, "--model", "DLinear", *RUN, "--loss", "quantile",
                      "--train_epochs", 1, "--quiet"))
    checkpoint = next((trained / "checkpoints").glob("*/checkpoint.pth"))
    return argparse.Namespace(root=root, data=data, folders=folders, checkpoint=checkpoint)


def ensemble_args(setup, members, *extra):
    return [*ETTH1_ARGS, "--root_path", setup.data, "--model", "Ensemble", "--is_training", 0,
            "--members", ",".join(map(str, members)), *RUN, *extra]


SCORES = ("mse", "mae", "wql", "mase", "smape", "coverage_80", "vali_loss", "test_objective_loss")


def test_the_ensemble_scores_the_same_on_1_2_3_processes_and_two_eval_batch_sizes(setup, tmp_path):
    argv = ensemble_args(setup, [*setup.folders, setup.checkpoint])
    outcomes = []
    for nproc, extra in ((None, ()), (2, ("--ddp", "--eval_batch_size", 5)), (3, ("--ddp", "--eval_batch_size", 7))):
        assert_ok(run_cli(tmp_path, *argv, *extra, nproc=nproc))
        outcomes.append(records(tmp_path)[-1])
    first = outcomes[0]
    assert [o["world_size"] for o in outcomes] == [1, 2, 3]
    assert first["test_windows"] == 20 and first["wql_levels"] == list(LEVELS_9)
    assert first["quantile_order"] == "as forecast"
    for outcome in outcomes[1:]:
        for key in SCORES:
            assert outcome[key] == pytest.approx(first[key], rel=1e-9, abs=0), (key, outcome["world_size"])
    assert not any((tmp_path / "checkpoints").rglob("*.pth"))  # zero-shot: nothing saved
    from exp.settings import load_trained_model  # the finished run's model back outside run.py, members loaded

    model = load_trained_model(next((tmp_path / "results").rglob("metrics.json")))
    assert len(model.members) == 4 and not model.training


# ------------------------------------------------------------------ in one process: members and the rule
def experiment(argv):
    return make_experiment(make_args(*argv))


def test_each_member_forecasts_as_its_own_run_once_a_batch_and_the_ensemble_is_their_median(setup, tmp_path):
    from data_provider.data_factory import data_provider
    from exp.forward import forward
    from models.foundation.release import open_release
    from utils.checkpoint import load_weights

    point = fake_checkpoint(tmp_path / "point")  # a point member: its forecast is its median
    members = [*setup.folders, setup.checkpoint, point]
    exp = experiment(ensemble_args(setup, members, "--eval_batch_size", 8))
    mean = experiment(ensemble_args(setup, members, "--eval_batch_size", 8, "--ensemble_rule", "mean"))
    ensemble = exp.raw_model.eval()  # as the experiment evaluates it
    mean.raw_model.eval()
    assert exp.args.native_quantiles == list(LEVELS_9) and len(ensemble.members) == len(members)
    loader = data_provider(exp.args, "test", exp.device)[1]
    batch = next(iter(loader))
    with torch.no_grad():
        combined = forward(ensemble, batch, exp.args, "test", exp.device)[0]  # [B, P, C, 9]
        by_mean = forward(mean.raw_model, batch, mean.args, "test", mean.device)[0]
        own, levels = [], []
        for path in members:  # each member as its own zero-shot run forecasts it
            source = (("--pretrain_model_path", path) if Path(path).is_dir() else ("--checkpoint", path)
                      + (("--loss", "quantile") if path == setup.checkpoint else ()))
            alone = experiment([*ETTH1_ARGS, "--root_path", setup.data, "--model", _model_of(path), "--is_training",
                                0, *source, *RUN])
            load_weights(alone.raw_model, str(path), opener=open_release)
            pred = forward(alone.raw_model.eval(), batch, alone.args, "test", alone.device)[0]
            own.append(pred if alone.args.objective is None else alone.args.objective.quantiles(pred))
            levels.append(None if alone.args.objective is None else [round(q, 9) for q in alone.args.objective.levels])
    for member, expected in zip(ensemble.members, own):
        with torch.no_grad():
            got = member(batch[0], None, None, None)
        assert torch.equal(got, expected)
    # the quantile members at the nine levels every one of them forecasts (the trained one: 13)
    quantiles = np.stack([o.numpy()[..., [lv.index(q) for q in LEVELS_9]] for o, lv in zip(own[:-1], levels)])
    median = np.median(quantiles, axis=0)
    median[..., 4] = np.median(np.concatenate([quantiles[..., 4], own[-1].numpy()[None]]), axis=0)
    np.testing.assert_allclose(combined.numpy(), median, rtol=1e-6, atol=1e-6)
    means = quantiles.astype(np.float64).mean(0)
    means[..., 4] = np.concatenate([quantiles[..., 4], own[-1].numpy()[None]]).astype(np.float64).mean(0)
    np.testing.assert_allclose(by_mean.numpy(), means, rtol=1e-6, atol=1e-6)
    assert not np.allclose(means, median)  # the two rules differ here

    calls = [0] * len(members)  # one forward per member per batch, whatever the number of levels
    for i, member in enumerate(ensemble.members):
        member.model.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    exp.evaluate(loader, "test")
    assert calls == [len(loader)] * len(members) and len(loader) == 3


def _model_of(path):
    from models.foundation.release import release_of

    return release_of(str(path))[1] if Path(path).is_dir() else "DLinear"


def test_levels_are_those_every_quantile_member_forecasts(setup, tmp_path):
    from exp.ensemble import member_specs, reconciled_levels

    three = fake_checkpoint(tmp_path / "three", loss="quantile", quantiles="0.1,0.5,0.9")
    point = fake_checkpoint(tmp_path / "point")
    folder = setup.folders[0]
    assert reconciled_levels(member_specs(f"{folder},{three}")) == (0.1, 0.5, 0.9)
    assert reconciled_levels(member_specs(f"{folder},{point}")) == LEVELS_9
    assert reconciled_levels(member_specs(f"{point},{fake_checkpoint(tmp_path / 'other')}")) == (0.5,)


def refusal(argv):
    from utils.errors import UserError

    with pytest.raises(UserError) as refused:
        experiment(argv)
    message = str(refused.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_bad_members_are_one_line(setup, tmp_path):
    folder, checkpoint = setup.folders[0], setup.checkpoint
    name = _model_of(folder)
    other = next(n for n in foundation.RELEASES if n != name)
    quartiles = fake_checkpoint(tmp_path / "quartiles", loss="quantile", quantiles="0.25,0.5,0.75")
    longer = fake_checkpoint(tmp_path / "longer", seq_len=96)
    target_only = fake_checkpoint(tmp_path / "target_only")  # trained with --covariate: the last channel only
    record = torch.load(target_only.parent / "last.pth", weights_only=False)
    record["identity"]["covariate"] = True
    torch.save(record, target_only.parent / "last.pth")
    cases = {
        "needs --members A,B": [],
        "at least two members": [folder],
        "give each member once": [folder, checkpoint, folder],
        "unknown --model 'Nope'": [f"Nope={folder}", checkpoint],
        f"read by --model {name}, not {other}": [f"{other}={folder}", checkpoint],
        "is no release folder": [tmp_path, checkpoint],
        "not found": [tmp_path / "nothing", checkpoint],
        "no training record (last.pth)": [folder, _without_record(tmp_path / "bare")],
        "share no quantile level but the median": [folder, quartiles],
        "was trained for --seq_len 96 --pred_len 24": [folder, longer],
        "was trained with --covariate (it forecasts the target channel only), the ensemble runs without it":
            [folder, target_only],
    }
    for message, members in cases.items():
        argv = ensemble_args(setup, members) if members else [*ETTH1_ARGS, "--root_path", setup.data, "--model",
                                                              "Ensemble", "--is_training", 0, *RUN]
        assert message in refusal(argv), (message, refusal(argv))
    assert "are read by --model Ensemble only, not --model DLinear" in refusal(
        [*ETTH1_ARGS, "--root_path", setup.data, "--model", "DLinear", "--members", f"{folder},{checkpoint}", *RUN])
    assert "add --is_training 0" in refusal([*ensemble_args(setup, [folder, checkpoint]), "--is_training", 1])
    assert "not --checkpoint" in refusal([*ensemble_args(setup, [folder, checkpoint]), "--checkpoint", checkpoint])
    seq_len, pred_len, says = next(row for row in foundation.RELEASES.values() if row.name == name).too_long
    # a release member that cannot take the context or horizon: its own line, naming the member
    message = refusal([*ensemble_args(setup, [folder, checkpoint]), "--seq_len", seq_len, "--pred_len", pred_len])
    assert message.startswith(f"ensemble member {folder}: ") and re.search(says, message), message


def _without_record(folder):
    path = fake_checkpoint(folder)
    (folder / "last.pth").unlink()
    return path


def test_the_harness_row_combines_the_members_own_harness_forecasts(setup, tmp_path):
    """GIFT-Eval's harness (and fev-bench's, which forecasts through it): each member forecasts as its own row
    would, the ensemble's quantiles their median; a zero-shot row, its quantiles as forecast."""
    pytest.importorskip("pyarrow")
    import json

    from benchmarks import gift_eval
    from benchmarks import gift_eval_models as models
    from test_gift_eval import csv_rows, write_synthetic_sets

    folder, checkpoint = setup.folders[0], setup.checkpoint
    argv = ["--model", "Ensemble", "--members", f"{folder},{checkpoint}", "--seq_len", 64, "--num_threads", 1]
    write_synthetic_sets(tmp_path / "data")
    gift_eval.run(gift_eval.parse_args(["--data_root", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
                                        "--datasets", "hospital", "--terms", "short", *map(str, argv)]))
    assert [r["dataset"] for r in csv_rows(tmp_path / "out" / "all_results.csv")] == ["hospital/M/short"]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "zero-shot"
    result = json.loads(next((tmp_path / "out" / "configurations").iterdir()).read_text())
    assert result["quantile_order"] == "as forecast" and not result["point_only"]

    histories = [10 + np.sin(np.arange(n) / 3.0) for n in (50, 90)]
    point, quantiles, _ = models.forecaster(argv, 1).forecast(histories, 30, gift_eval.impute)
    own = [models.ModelForecaster(["--model", _model_of(folder), "--pretrain_model_path", folder, "--seq_len", 64,
                                   "--num_threads", 1], 1),
           models.ModelForecaster(["--model", "DLinear", "--checkpoint", checkpoint, *SHAPES, "--loss", "quantile",
                                   "--num_threads", 1], 1)]
    forecasts = [f.forecast(histories, 30, gift_eval.impute)[1] for f in own]
    np.testing.assert_allclose(quantiles, (forecasts[0] + forecasts[1]) / 2, rtol=1e-12)  # two: their middle
    np.testing.assert_allclose(point, quantiles[:, 4], rtol=0)


def test_two_ensembles_never_share_a_results_folder(tmp_path):
    """The setting (the folder under --results_dir and --checkpoints) names the rule and the members' real paths:
    two ensembles of the same --model, data and shapes otherwise wrote metrics.json into one folder."""
    from exp.settings import setting_name

    base = make_args(*ETTH1_ARGS, "--model", "Ensemble")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()

    def name(members, rule="median"):
        return setting_name(argparse.Namespace(**{**vars(base), "members": members, "ensemble_rule": rule,
                                                     "autoregressive": False}), 0)

    one = name(f"{tmp_path}/a,{tmp_path}/b")
    assert one == name(f"Named={tmp_path}/a/../a, {tmp_path}/b")  # the same members, spelled otherwise
    assert len({one, name(f"{tmp_path}/a,{tmp_path}/b", "mean"), name(f"{tmp_path}/b,{tmp_path}/a"),
                name(f"{tmp_path}/a,{tmp_path}/c")}) == 4


# ------------------------------------------------------------------ fine-tuned releases and distribution members
OTHER_SHAPES = ("--seq_len", 96, "--pred_len", 48, "--label_len", 0, "--val_windows", 12, "--test_windows", 20,
                "--num_threads", 1)


@pytest.fixture(scope="module")
def tuned(setup):
    """A release fixture fine-tuned here (--adaptation --pretrain_model_path, two steps) and a DLinear trained
    with a distribution loss (--loss studentt, two steps): checkpoint.pth with the last.pth of its run beside."""
    folder = setup.folders[0]
    name = _model_of(folder)
    runs = {"release": ("--model", name, "--adaptation", "--pretrain_model_path", folder),
            "studentt": ("--model", "DLinear", "--loss", "studentt")}
    found = {}
    for key, model in runs.items():
        out = setup.root / key
        assert_ok(run_cli(out, *ETTH1_ARGS, "--root_path", setup.data, *model, *RUN, "--train_epochs", 1,
                          "--train_steps", 2, "--quiet"))
        found[key] = next((out / "checkpoints").glob("*/checkpoint.pth"))
    return argparse.Namespace(folder=folder, name=name, checkpoint=found["release"], studentt=found["studentt"])


def own_evaluation(setup, argv, shapes=RUN):
    """The experiment of `argv`'s own --is_training 0 run, with the weights that run evaluates loaded as its test
    loads them (exp.settings.evaluated_weights, exp.exp_forecast's loader), in eval mode."""
    from exp.exp_forecast import _load_evaluated
    from exp.settings import evaluated_weights, setting_name

    alone = experiment([*ETTH1_ARGS, "--root_path", setup.data, "--is_training", 0, *argv, *shapes])
    path, pretrained = evaluated_weights(alone.args, setting_name(alone.args, 0))
    _load_evaluated(alone.raw_model, path, pretrained, alone.device)
    alone.raw_model.eval()
    return alone


def own_quantiles(alone, batch):
    from exp.forward import forward

    with torch.no_grad():
        return alone.args.objective.quantiles(forward(alone.raw_model, batch, alone.args, "test", alone.device)[0])


def test_a_fine_tuned_release_forecasts_as_its_own_evaluation_at_any_context_and_horizon(setup, tuned, tmp_path):
    """A checkpoint fine-tuned from a release is built from that release's folder (its record's
    --pretrain_model_path), so its own `--is_training 0 --adaptation --pretrain_model_path DIR` run evaluates it at
    any context and horizon, and the ensemble does as that run does: the same bits, at the shapes it was
    fine-tuned for and at others."""
    from data_provider.data_factory import data_provider

    own_argv = ("--model", tuned.name, "--adaptation", "--pretrain_model_path", tuned.folder)
    # the run's own weights: the setting's checkpoint.pth, what --is_training 0 --adaptation evaluates
    assert own_evaluation(setup, [*own_argv, "--checkpoints", tuned.checkpoint.parents[1]]).args.weights_source \
        == "setting"
    for shapes in (RUN, OTHER_SHAPES):
        shapes = (*shapes, "--eval_batch_size", 4)
        exp = experiment([*ETTH1_ARGS, "--root_path", setup.data, "--model", "Ensemble", "--is_training", 0,
                          "--members", f"{setup.folders[1]},{tuned.checkpoint}", *shapes])
        batch = next(iter(data_provider(exp.args, "test", exp.device)[1]))
        alone = own_evaluation(setup, [*own_argv, "--checkpoint", tuned.checkpoint], shapes)
        expected = own_quantiles(alone, batch)
        if shapes[1] == RUN[1]:  # fine-tuning changed its forecast: the release's own would not pass
            zero_shot = own_evaluation(setup, ["--model", tuned.name, "--pretrain_model_path", tuned.folder], shapes)
            assert not torch.equal(expected, own_quantiles(zero_shot, batch))
        with torch.no_grad():
            got = exp.raw_model.eval().members[1](batch[0], None, None, None)
        assert got.shape[1] == alone.args.pred_len and torch.equal(got, expected), shapes
    # what its release cannot take: the release's own line, naming the member
    seq_len, pred_len, says = next(row for row in foundation.RELEASES.values() if row.name == tuned.name).too_long
    message = refusal([*ensemble_args(setup, [tuned.checkpoint, setup.folders[1]]), "--seq_len", seq_len,
                       "--pred_len", pred_len])
    assert message.startswith(f"ensemble member {tuned.checkpoint}: ") and re.search(says, message), message
    # the release it was fine-tuned from gone (or a relative path read elsewhere): one line saying so
    (tmp_path / "checkpoint.pth").symlink_to(tuned.checkpoint)
    record = torch.load(tuned.checkpoint.parent / "last.pth", map_location="cpu", weights_only=True, mmap=True)
    torch.save({"identity": {**record["identity"], "pretrain_model_path": "moved/away"}}, tmp_path / "last.pth")
    assert "was fine-tuned from the release moved/away (its training record" in refusal(
        ensemble_args(setup, [tmp_path / "checkpoint.pth", setup.folders[1]]))


def test_a_distribution_member_is_scored_at_the_ensembles_levels_as_its_own_run(setup, tuned):
    """A checkpoint trained with --loss studentt forecasts its --quantiles from its exact inverse CDF (float64):
    inside the ensemble, the same bits as its own run scores, at each of the ensemble's levels, and combined
    without rounding whatever the members' order (here the median of three is its value wherever it is the
    middle one)."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward
    from utils.probabilistic import DEFAULT_LEVELS

    members = [setup.folders[1], tuned.studentt, setup.folders[2]]
    exp = experiment(ensemble_args(setup, members))
    ensemble = exp.raw_model.eval()
    batch = next(iter(data_provider(exp.args, "test", exp.device)[1]))
    alone = own_evaluation(setup, ["--model", "DLinear", "--checkpoint", tuned.studentt, "--loss", "studentt"])
    own = own_quantiles(alone, batch)
    assert alone.args.objective.levels == DEFAULT_LEVELS and own.dtype == torch.float64
    assert exp.args.native_quantiles == list(LEVELS_9)
    with torch.no_grad():
        outputs = [member(batch[0], None, None, None) for member in ensemble.members]
        combined = forward(ensemble, batch, exp.args, "test", exp.device)[0]
    assert torch.equal(outputs[1], own)
    at_levels = outputs[1][..., ensemble.picks[1]]
    assert torch.equal(at_levels, own[..., [DEFAULT_LEVELS.index(q) for q in LEVELS_9]])
    values = torch.stack([out[..., pick].double() for out, pick in zip(outputs, ensemble.picks)])
    assert combined.dtype == torch.float64 and torch.equal(combined, values.sort(0).values[1])
    middle = values.sort(0).indices[1] == 1  # where the distribution member is the median: its own value
    assert middle.any() and torch.equal(combined[middle], at_levels[middle])


def test_the_harness_row_with_a_fine_tuned_release_and_a_distribution_member(setup, tuned):
    """GIFT-Eval's harness: each member forecasts as its own row (ModelForecaster) would, a fine-tuned release
    from the ensemble's context at the horizon it was fine-tuned for, rolled out as its row with --checkpoint
    is; the ensemble's quantiles the median of the three, bit for bit."""
    pytest.importorskip("pyarrow")
    from benchmarks import gift_eval
    from benchmarks import gift_eval_models as models

    release = setup.folders[1]
    argv = ["--model", "Ensemble", "--members", f"{release},{tuned.checkpoint},{tuned.studentt}", "--seq_len", 96,
            "--num_threads", 1]
    histories = [10 + np.sin(np.arange(n) / 3.0) for n in (50, 130)]
    ensemble = models.forecaster(argv, 1)
    point, quantiles, _ = ensemble.forecast(histories, 30, gift_eval.impute)
    rows = [["--model", _model_of(release), "--pretrain_model_path", release, "--seq_len", 96],
            ["--model", tuned.name, "--adaptation", "--pretrain_model_path", tuned.folder, "--checkpoint",
             tuned.checkpoint, "--seq_len", 96, "--pred_len", 24, "--label_len", 0],
            ["--model", "DLinear", "--checkpoint", tuned.studentt, *SHAPES, "--loss", "studentt"]]
    own = [models.ModelForecaster([*row, "--num_threads", 1], 1).forecast(histories, 30, gift_eval.impute)[1]
           for row in rows]
    for (model, run), expected in zip(ensemble._built(30)[0], own):  # each member as the ensemble built it
        assert np.array_equal(models.forecast_with(model, run, histories, 30, gift_eval.impute, ensemble.device)[1],
                              expected), run.model
    assert np.array_equal(quantiles, np.median(np.stack(own), 0)) and np.array_equal(point, quantiles[:, 4])
