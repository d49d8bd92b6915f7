"""The per-model scripts under scripts/long_term_forecast/: every model of the zoo (models.ZOO) has one per
data set, and they run as a researcher runs them (bash, extra flags last), with tiny models on an
ETTh1-shaped file. A user's model outside the zoo needs none: the suite names what joining would take."""
import math
import re

import pytest

from helpers import REPO, assert_ok, records, run_command, write_etth1_shaped

SCRIPTS = REPO / "scripts" / "long_term_forecast"
# (folder, --data name in the script's file name, the data file it must pass)
DATA_SETS = [("ETT_script", "ETTh1", "ETTh1.csv"), ("Exchange_script", "Exchange", "exchange_rate.txt.gz")]
TINY = ["--d_model", "16", "--d_ff", "32", "--n_heads", "2", "--train_epochs", "1", "--num_threads", "1",
        "--no_plots", "--quiet"]


def _outputs(tmp_path):
    return ["--checkpoints", str(tmp_path / "checkpoints"), "--results_dir", str(tmp_path / "results")]


# Timer's run leaves its 96 roll-out to the TRAIN=0 run, which must give the training run's figures: one process
# fewer than each test rolling out 96 itself; TimerXL's run rolls out two horizons, the script's loop.
HORIZONS = {"Timer": ["192"], "TimerXL": ["96", "192"]}


@pytest.mark.parametrize("model", sorted(HORIZONS))
def test_protocol_c_script_trains_once_and_rolls_out_each_horizon(tmp_path, model):
    """One training (pred_len 96), then the same checkpoint rolled out to every horizon in PRED_LENS;
    the run names carry the input length actually used (--seq_len 192 here, not the script's 672).
    TRAIN=0 then only evaluates that checkpoint again. Rolled out to 96, the trained model gives its own figures."""
    root = write_etth1_shaped(tmp_path / "ETT-small")
    script = str(SCRIPTS / "ETT_script" / f"{model}_ETTh1.sh")
    argv = ["--seq_len", "192", *TINY, *_outputs(tmp_path)]
    env = {"PRED_LENS": " ".join(HORIZONS[model]), "ROOT_PATH": f"{root}/"}
    assert_ok(run_command(["bash", script, *argv], extra_env=env, timeout=400))
    if model == "Timer":
        assert_ok(run_command(["bash", script, *argv], extra_env=dict(env, TRAIN="0", PRED_LENS="96"), timeout=400))
    trained, *rolled = records(tmp_path)
    rolled = {r["args"]["test_pred_len"]: r for r in rolled}
    assert len(rolled) == 2 and trained["args"]["model_id"] == "ETTh1_192_96"
    assert [r["args"]["model_id"] for r in rolled.values()] == [f"ETTh1_192_{h}_rollout" for h in rolled]
    assert trained["args"]["is_training"] == 1 and {r["args"]["is_training"] for r in rolled.values()} == {0}
    assert {r["args"]["seq_len"] for r in (trained, *rolled.values())} == {192}
    # the 96 roll-out is the trained model on the same test windows: the same figures
    assert rolled[96]["mse"] == pytest.approx(trained["mse"], rel=1e-6)
    assert rolled[96]["test_windows"] == trained["test_windows"]
    assert math.isfinite(rolled[192]["mse"])
    assert rolled[192]["test_windows"] == trained["test_windows"] - 96  # 96 more steps per window


def script_problems(model, folder, data, data_file):
    """What is wrong with <folder>/<model>_<data>.sh, the script benchmarks/reproduce.py runs: missing, or not
    training that model on that file with the caller's flags passed on last (so they override)."""
    script = SCRIPTS / folder / f"{model}_{data}.sh"
    if not script.exists():
        return [f"{script.relative_to(REPO)} is missing"]
    text = script.read_text()
    wanted = {f"--model {model}": rf"--model {model}\b",
              f"--data_path {data_file}": rf"--data_path {re.escape(data_file)}\b", '"$@"': r'"\$@"'}
    return [f"{script.relative_to(REPO)} does not pass {what}" for what, pattern in wanted.items()
            if not re.search(pattern, text)]


@pytest.mark.parametrize("folder,data,data_file", DATA_SETS)
def test_every_zoo_model_has_a_script_per_data_set(folder, data, data_file):
    from models import ZOO, available_models

    assert set(ZOO) <= set(available_models()), "models.ZOO names a model models/ does not hold"
    problems = [problem for model in ZOO for problem in script_problems(model, folder, data, data_file)]
    assert not problems, "; ".join(problems)


def joining_the_zoo(model):
    """The scripts `model` lacks to join the zoo, in one line, or None when it has them all."""
    problems = [problem for data_set in DATA_SETS for problem in script_problems(model, *data_set)]
    if not problems:
        return None
    return (f"{model} is not in the zoo (models.ZOO), so it needs no scripts; to join the zoo: "
            f"{'; '.join(problems)} (models/README.md#joining-the-zoo)")


def test_a_model_outside_the_zoo_is_told_what_joining_takes():
    """A user's models/<Name>.py is not failed for the zoo's scripts: it is named, with what it lacks."""
    from models import outside_zoo

    needs = [line for line in map(joining_the_zoo, outside_zoo()) if line]
    if needs:
        pytest.skip(" | ".join(needs))


def test_what_a_users_model_lacks_is_named_and_nothing_fails(monkeypatch):
    """A user's file dropped into models/ (here by the registry's discovery): the zoo's test still passes,
    and the outside-the-zoo one skips naming both scripts it would need."""
    import models

    monkeypatch.setattr(models, "available_models", lambda: sorted([*models.ZOO, "MyModel"]))
    for data_set in DATA_SETS:
        test_every_zoo_model_has_a_script_per_data_set(*data_set)
    with pytest.raises(pytest.skip.Exception) as skipped:
        test_a_model_outside_the_zoo_is_told_what_joining_takes()
    assert str(skipped.value) == (
        "MyModel is not in the zoo (models.ZOO), so it needs no scripts; to join the zoo: "
        "scripts/long_term_forecast/ETT_script/MyModel_ETTh1.sh is missing; "
        "scripts/long_term_forecast/Exchange_script/MyModel_Exchange.sh is missing (models/README.md#joining-the-zoo)")
    assert joining_the_zoo("DLinear") is None
