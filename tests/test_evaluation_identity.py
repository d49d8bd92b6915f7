"""--is_training 0 evaluates weights under the model arguments that trained them (issue 36, item 5): the
training state beside the weights (last.pth) records the run's identity, which --resume compares; evaluation
compares the arguments that decide what the model computes and refuses others in one line, as --resume does.
Weights without a training record (another program's, a copy) are evaluated as given."""
import shutil

from helpers import assert_ok, records, run_cli

DLINEAR = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--num_threads", 1]


def test_evaluation_under_another_moving_average_is_refused_naming_it(tmp_path):
    assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1))
    trained = records(tmp_path)[0]
    folder = tmp_path / "checkpoints" / trained["setting"]
    metrics = tmp_path / "results" / trained["setting"] / "metrics.json"
    before = metrics.read_bytes()

    proc = run_cli(tmp_path, *DLINEAR, "--is_training", 0, "--moving_avg", 13)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert errors == [f"error: cannot evaluate {folder / 'checkpoint.pth'}: it was trained under other model "
                      f"arguments ({folder / 'last.pth'} records them): moving_avg (saved 25, now 13). Evaluate with "
                      "the arguments it was trained with (compared: --model, --label_len, the token lengths, "
                      "--covariate and the model's arguments but --dropout)"], proc.stderr[-3000:]
    assert len(records(tmp_path)) == 1 and metrics.read_bytes() == before  # nothing written

    # --dropout is off in evaluation: not compared, and the trained model's metrics come out
    assert_ok(run_cli(tmp_path, *DLINEAR, "--is_training", 0, "--dropout", 0.3))
    assert records(tmp_path)[-1]["mse"] == trained["mse"]

    # the same weights copied away from their training record: evaluated as given, as before
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(folder / "checkpoint.pth", tmp_path / "elsewhere" / "weights.pth")
    assert_ok(run_cli(tmp_path, *DLINEAR, "--is_training", 0, "--moving_avg", 13,
                      "--checkpoint", tmp_path / "elsewhere" / "weights.pth"))
    assert records(tmp_path)[-1]["mse"] != trained["mse"]  # another function of the same weights
