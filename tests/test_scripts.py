"""The per-model scripts under scripts/long_term_forecast/: every registered model has one per data set,
and they run as a researcher runs them (bash, extra flags last), with tiny models on an ETTh1-shaped file."""
import math
import re

import pytest

from helpers import REPO, assert_ok, records, run_command, write_etth1_shaped

SCRIPTS = REPO / "scripts" / "long_term_forecast"
TINY = ["--d_model", "16", "--d_ff", "32", "--n_heads", "2", "--train_epochs", "1", "--num_threads", "1",
        "--no_plots", "--quiet"]


def _outputs(tmp_path):
    return ["--checkpoints", str(tmp_path / "checkpoints"), "--results_dir", str(tmp_path / "results")]


@pytest.mark.parametrize("model", ["Timer", "TimerXL"])
def test_protocol_c_script_trains_once_and_rolls_out_each_horizon(tmp_path, model):
    """One training (pred_len 96), then the same checkpoint rolled out to every horizon in PRED_LENS;
    the run names carry the input length actually used (--seq_len 192 here, not the script's 672).
    TRAIN=0 then only evaluates that checkpoint again."""
    root = write_etth1_shaped(tmp_path / "ETT-small")
    script = str(SCRIPTS / "ETT_script" / f"{model}_ETTh1.sh")
    argv = ["--seq_len", "192", *TINY, *_outputs(tmp_path)]
    env = {"PRED_LENS": "96 192", "ROOT_PATH": f"{root}/"}
    assert_ok(run_command(["bash", script, *argv], extra_env=env, timeout=400))
    trained, rolled_96, rolled_192 = records(tmp_path)
    assert [r["args"]["model_id"] for r in (trained, rolled_96, rolled_192)] == [
        "ETTh1_192_96", "ETTh1_192_96_rollout", "ETTh1_192_192_rollout"]
    assert trained["args"]["is_training"] == 1 and rolled_96["args"]["is_training"] == 0
    assert [r["args"]["seq_len"] for r in (trained, rolled_96, rolled_192)] == [192, 192, 192]
    # the 96 roll-out is the trained model on the same test windows: the same figures
    assert rolled_96["mse"] == pytest.approx(trained["mse"], rel=1e-6)
    assert rolled_96["test_windows"] == trained["test_windows"]
    assert rolled_192["args"]["test_pred_len"] == 192 and math.isfinite(rolled_192["mse"])
    assert rolled_192["test_windows"] == trained["test_windows"] - 96  # 96 more steps per window
    if model != "Timer":
        return
    assert_ok(run_command(["bash", script, *argv], extra_env=dict(env, TRAIN="0", PRED_LENS="96"), timeout=400))
    again = records(tmp_path)[3:]
    assert len(again) == 1 and again[0]["args"]["is_training"] == 0
    assert again[0]["mse"] == pytest.approx(trained["mse"], rel=1e-6)


@pytest.mark.parametrize("folder,data,data_file", [("ETT_script", "ETTh1", "ETTh1.csv"),
                                                    ("Exchange_script", "Exchange", "exchange_rate.txt.gz")])
def test_every_registered_model_has_a_script_per_data_set(folder, data, data_file):
    """benchmarks/reproduce.py runs <folder>/<Model>_<data>.sh: each model the registry finds has one, which
    trains that model on that file and passes the caller's flags on last (so they override)."""
    from models import available_models

    problems = []
    for model in available_models():
        script = SCRIPTS / folder / f"{model}_{data}.sh"
        if not script.exists():
            problems.append(f"{script.relative_to(REPO)} is missing")
            continue
        text = script.read_text()
        for what, pattern in [(f"--model {model}", rf"--model {model}\b"), (f"--data_path {data_file}",
                              rf"--data_path {re.escape(data_file)}\b"), ('"$@"', r'"\$@"')]:
            if not re.search(pattern, text):
                problems.append(f"{script.relative_to(REPO)} does not pass {what}")
    assert not problems, "; ".join(problems)
