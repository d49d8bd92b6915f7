"""Large-model workflow: univariate pre-training data, fine-tuning from a checkpoint, few-shot subsets."""
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DistributedSampler

from data_provider.data_factory import data_provider, prepared_data
from data_provider.synthetic import make_synthetic
from helpers import SMALL_TIMERXL, assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks
from utils.errors import UserError

TIMERXL = [*SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 24, "--seq_len", 96, "--num_threads", 1]


def _corpus(folder):
    """Five series in three files of three formats; value = 1000 x series number + row, so every
    window shows which series and rows it came from. Returns each series' length."""
    (folder / "sub").mkdir(parents=True)
    dates = pd.date_range("2021-01-01", periods=300, freq="h")
    pd.DataFrame({"date": dates, "a": 1000 + np.arange(300.0), "b": 2000 + np.arange(300.0)}).to_csv(
        folder / "two.csv", index=False)
    np.save(folder / "one.npy", 3000 + np.arange(250.0))
    raw = np.stack([4000 + np.arange(200.0), 5000 + np.arange(200.0)], axis=1)
    np.savetxt(folder / "sub" / "raw.txt", raw, delimiter=",")
    return [300, 300, 250, 200, 200]


def _split_lengths(rows, history):
    """Rows of train, val, test of one series (70/10/20; val and test start `history` rows early)."""
    train_end, test_start = int(rows * 0.7), rows - int(rows * 0.2)
    return [train_end, test_start - max(train_end - history, 0), rows - max(test_start - history, 0)]


@pytest.mark.parametrize("autoregressive", [False, True])
def test_univariate_windows_stay_inside_one_series_and_count_right(tmp_path, autoregressive):
    lengths = _corpus(tmp_path)
    args = make_args("--data", "univariate", "--root_path", tmp_path, "--data_path", "**/*", "--scale", "false",
                     "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--input_token_len", 24,
                     "--output_token_len", 24)
    args.autoregressive, args.test_seq_len, args.test_pred_len = autoregressive, 48, 24
    # one series per channel, files in sorted path order (one.npy, sub/raw.txt, two.csv)
    series = prepared_data(args).series
    assert [(s[0], len(s)) for s in series] == [(3000, 250), (4000, 200), (5000, 200), (1000, 300), (2000, 300)]
    for flag in ("train", "val", "test"):
        dataset, loader = data_provider(args, flag)
        window = dataset.window
        per_series = [max(_split_lengths(rows, window.x_len)[("train", "val", "test").index(flag)] - window.span + 1, 0)
                      for rows in lengths]
        expected = sum(per_series)
        assert len(dataset) == expected > 0, flag
        x, y, x_mark, _ = dataset.__getitems__(torch.arange(len(dataset)))
        assert x.shape == (expected, window.x_len, 1) and x_mark.shape == (expected, window.x_len, 0)
        series, row = torch.div(x[:, 0, 0], 1000, rounding_mode="floor"), x[:, 0, 0] % 1000
        # every step of input and target is the next row of the same series: no boundary crossed
        steps = torch.arange(max(window.x_len, window.y_offset + window.y_len), dtype=x.dtype)
        torch.testing.assert_close(x[..., 0], (series * 1000 + row)[:, None] + steps[:window.x_len], rtol=0, atol=0)
        torch.testing.assert_close(y[..., 0], (series * 1000 + row)[:, None] + steps[window.y_offset:][:window.y_len],
                                   rtol=0, atol=0)
        assert [int((series == i + 1).sum()) for i in range(5)] == per_series  # short series add nothing
        # the loader yields the same windows (shuffled for training), each exactly once
        seen = torch.cat([batch[0][:, 0, 0] for batch in loader])
        assert sorted(seen.tolist()) == sorted(x[:, 0, 0].tolist())


@pytest.mark.parametrize("flag, selection", [("train", ["--subset_rand_ratio", 0.5]), ("val", ["--val_windows", 6])])
def test_a_selection_of_univariate_windows_takes_the_splits_windows(tmp_path, flag, selection):
    """Univariate windows are already a selection of the series laid end to end; few-shot and
    --val_windows select again, through it: every window chosen is one of the split's, none crosses series."""
    _corpus(tmp_path)
    argv = ["--data", "univariate", "--root_path", tmp_path, "--data_path", "**/*", "--scale", "false",
            "--seq_len", 48, "--label_len", 24, "--pred_len", 24]

    def windows(*extra):
        args = make_args(*argv, *extra)
        args.autoregressive = False
        dataset = data_provider(args, flag)[0]
        return dataset.__getitems__(torch.arange(len(dataset)))[:2]

    (x, y), (whole_x, _) = windows(*selection), windows()
    assert 0 < len(x) < len(whole_x)
    # values are 1000 x series + row: each window runs on through consecutive rows of one series
    start = x[:, :1, 0]
    torch.testing.assert_close(x[..., 0], start + torch.arange(48.0), rtol=0, atol=0)
    torch.testing.assert_close(y[..., 0], start + torch.arange(24.0, 72.0), rtol=0, atol=0)
    assert set(start[:, 0].tolist()) <= set(whole_x[:, 0, 0].tolist())  # and starts where a split's window does


def test_ett_named_files_get_ett_borders_and_every_series_its_own_scaler(tmp_path):
    rng = np.random.default_rng(0)
    values = np.stack([rng.normal(5, 2, 14400), rng.normal(-300, 40, 14400)], axis=1)
    pd.DataFrame(values, columns=["u", "v"]).to_csv(tmp_path / "ETTh1.csv", index=False)
    pd.DataFrame({"w": rng.normal(50, 9, 1000)}).to_csv(tmp_path / "other.csv", index=False)
    args = make_args("--data", "univariate", "--root_path", tmp_path, "--data_path", "*.csv")
    args.autoregressive = False
    data = prepared_data(args)
    assert data.ends == [[8640, 11520, 14400]] * 2 + [[700, 800, 1000]]
    for series, ends in zip(data.series, data.ends):
        assert abs(series[:ends[0]].mean()) < 1e-4 and series[:ends[0]].std() == pytest.approx(1, rel=1e-4)
    assert len(data_provider(args, "train")[0]) == 2 * (8640 - 192 + 1) + (700 - 192 + 1)


def _few_shot_windows(rank, world):
    args = make_args("--synthetic_rows", 1500, "--subset_rand_ratio", 0.2, "--ddp")
    args.autoregressive = False
    return data_provider(args, "train")[0].indices.tolist()


def test_few_shot_subset_is_the_same_on_every_rank():
    first, second = run_on_ranks(_few_shot_windows, 2)
    assert len(first) == 172 and first == second


def test_few_shot_subset_is_random_deterministic_and_train_only():
    def build(*argv):
        args = make_args("--synthetic_rows", 1500, *argv)
        args.autoregressive = False
        return {flag: data_provider(args, flag)[0] for flag in ("train", "val", "test")}

    full, few = build(), build("--subset_rand_ratio", 0.2)
    assert len(few["train"]) == round(0.2 * len(full["train"])) == 172
    assert [len(few[f]) for f in ("val", "test")] == [len(full[f]) for f in ("val", "test")]
    chosen = few["train"].indices
    assert chosen.tolist() == sorted(set(chosen.tolist())) and chosen.max() >= len(full["train"]) // 2
    assert torch.equal(chosen, build("--subset_rand_ratio", 0.2)["train"].indices)  # same again
    assert not torch.equal(chosen, build("--subset_rand_ratio", 0.2, "--seed", 1)["train"].indices)
    for part, whole in zip(few["train"].__getitems__([0, 5, 171]), full["train"].__getitems__(chosen[[0, 5, 171]])):
        torch.testing.assert_close(part, whole, rtol=0, atol=0)
    for part, whole in zip(few["train"][171], full["train"][int(chosen[171])]):  # one window, by index
        torch.testing.assert_close(part, whole, rtol=0, atol=0)
    with pytest.raises(IndexError):
        few["train"][172]
    # DDP shards the subset, not the full set: two ranks together see exactly the chosen windows
    shards = [list(DistributedSampler(few["train"], num_replicas=2, rank=r, shuffle=True, seed=3)) for r in (0, 1)]
    assert sorted(set(shards[0] + shards[1])) == list(range(172))
    assert len(build("--subset_rand_ratio", 1e-9)["train"]) == 1  # never empty


# ---------------------------------------------------------------- pre-train, then fine-tune
@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny TimerXL pre-trained under 2-process DDP on eleven univariate series."""
    tmp = tmp_path_factory.mktemp("pretrain")
    corpus = tmp / "corpus"
    corpus.mkdir()
    make_synthetic(rows=1500, channels=7, seed=7).to_csv(corpus / "a.csv", index=False)
    np.save(corpus / "b.npy", make_synthetic(rows=1200, channels=4, seed=8).drop(columns="date").to_numpy())
    argv = [*TIMERXL, "--data", "univariate", "--root_path", corpus, "--data_path", "*", "--train_epochs", 2,
            "--learning_rate", 1e-3, "--model_id", "pretrain"]
    proc = run_cli(tmp, *argv, "--ddp", nproc=2)
    assert_ok(proc)
    record = records(tmp)[-1]
    return tmp, argv, record, tmp / "checkpoints" / record["setting"] / "checkpoint.pth"


def test_pretraining_under_ddp_has_exact_metrics(pretrained):
    tmp, argv, record, checkpoint = pretrained
    assert record["world_size"] == 2 and record["args"]["enc_in"] == 1
    assert record["train_windows"] == 7 * (1050 - 120 + 1) + 4 * (840 - 120 + 1)
    assert_ok(run_cli(tmp, *argv, "--is_training", 0, "--checkpoint", checkpoint))  # 1 process, the same weights
    again = records(tmp)[-1]
    assert again["world_size"] == 1 and again["test_windows"] == record["test_windows"]
    for key in ("mse", "mae", "vali_loss"):
        assert again[key] == pytest.approx(record[key], rel=1e-6), key


@pytest.mark.parametrize("flag", ["--inverse", "--do_predict"])
def test_univariate_data_has_no_original_scale_to_return_to(pretrained, flag):
    """Every series has its own scaler: --inverse and --do_predict refuse, in one line."""
    tmp, argv, _, checkpoint = pretrained
    proc = run_cli(tmp, *argv, "--is_training", 0, "--checkpoint", checkpoint, flag)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "no single original scale" in errors[0], proc.stderr[-2000:]


def test_few_shot_fine_tuning_starts_from_the_pretrained_weights(tmp_path, pretrained):
    checkpoint = pretrained[3]
    argv = [*TIMERXL, "--features", "S", "--synthetic_rows", 1500, "--train_epochs", 1, "--subset_rand_ratio", 0.2]
    tuned = run_cli(tmp_path, *argv, "--model_id", "tuned", "--adaptation", "--pretrain_model_path", checkpoint)
    assert_ok(tuned)
    assert f"fine-tuning from {checkpoint}" in tuned.stdout
    assert_ok(run_cli(tmp_path, *argv, "--model_id", "scratch"))
    tuned, scratch = records(tmp_path)
    assert tuned["train_windows"] == scratch["train_windows"] == round(0.2 * (1050 - 120 + 1))
    # the same few windows in the same order: only the starting weights differ
    assert tuned["history"][0]["train_loss"] < 0.7 * scratch["history"][0]["train_loss"]
    assert tuned["mse"] < scratch["mse"]


def test_a_fine_tuning_runs_arguments_with_is_training_0_evaluate_its_fine_tuned_weights(tmp_path, pretrained):
    """`--is_training 0` added to a fine-tuning command scores what that command trained (a foundation model
    still builds its sizes from the --pretrain_model_path folder), not the pre-trained weights: the same
    metrics as the fine-tuning run's own test, and one warning line says so. Planted: --adaptation ignored
    (zero-shot of the pre-trained weights): fails."""
    checkpoint = pretrained[3]
    argv = [*TIMERXL, "--features", "S", "--synthetic_rows", 1500, "--train_epochs", 1, "--model_id", "tuned",
            "--adaptation", "--pretrain_model_path", checkpoint]
    assert_ok(run_cli(tmp_path, *argv))
    proc = run_cli(tmp_path, *argv, "--is_training", 0)
    assert_ok(proc)
    said = [line for line in proc.stdout.splitlines() if line.startswith("warning: --is_training 0 with --adaptation")]
    assert len(said) == 1 and "evaluates the fine-tuned weights of setting" in said[0] and str(checkpoint) in said[0]
    tuned, evaluated = records(tmp_path)
    assert evaluated["setting"] == tuned["setting"]
    for key in ("mse", "mae", "vali_loss"):
        assert evaluated[key] == pytest.approx(tuned[key], rel=1e-6), key
    proc = run_cli(tmp_path, *argv, "--is_training", 0, "--checkpoint", tmp_path / "a.pth", "--test_dir", "x")
    assert proc.returncode == 2 and "keep one of them" in proc.stderr


def test_adaptation_loads_every_weight_strictly(pretrained):
    from exp.adaptation import load_pretrained

    checkpoint = pretrained[3]
    exp = make_experiment(make_args(*TIMERXL, "--features", "S", "--synthetic_rows", 1500, "--adaptation",
                                 "--pretrain_model_path", checkpoint))
    saved = torch.load(checkpoint, weights_only=True)
    assert not all(torch.equal(v, saved[k]) for k, v in exp.raw_model.state_dict().items())
    load_pretrained(exp.raw_model, str(checkpoint), exp.device)
    state = exp.raw_model.state_dict()
    assert sorted(state) == sorted(saved) and all(torch.equal(state[k], saved[k]) for k in saved)
    # another architecture is refused by name, and nothing is half-loaded
    other = make_experiment(make_args(*TIMERXL, "--e_layers", 2, "--features", "S", "--synthetic_rows", 1500))
    before = {k: v.clone() for k, v in other.raw_model.state_dict().items()}
    with pytest.raises(UserError, match=r"cannot fine-tune from --pretrain_model_path: checkpoint .* does not fit "
                                        r"model TimerXL: missing: blocks\.layers\.1\."):
        load_pretrained(other.raw_model, str(checkpoint), other.device)
    assert all(torch.equal(v, before[k]) for k, v in other.raw_model.state_dict().items())


def _fine_tune_start_reading_on_rank_0_only(rank, world, checkpoint):
    from exp.adaptation import load_pretrained

    exp = make_experiment(make_args(*TIMERXL, "--features", "S", "--synthetic_rows", 1500, "--ddp"))
    if rank > 0:  # another node, which does not see rank 0's disk: reading the file here is the bug
        torch.load = lambda *args, **kwargs: (_ for _ in ()).throw(AssertionError(f"rank {rank} read {args[0]}"))
    load_pretrained(exp.raw_model, str(checkpoint), exp.device)
    return {k: v.numpy().copy() for k, v in exp.raw_model.state_dict().items()}  # numpy: pickled by value


def test_pretrained_weights_are_read_by_rank_0_and_broadcast(pretrained):
    """Fine-tuning on several nodes needs the pre-trained file on rank 0's disk only."""
    saved = torch.load(pretrained[3], weights_only=True)
    for state in run_on_ranks(_fine_tune_start_reading_on_rank_0_only, 2, pretrained[3]):
        assert sorted(state) == sorted(saved) and all(np.array_equal(state[k], saved[k].numpy()) for k in saved)


# ---------------------------------------------------------------- bad input
def test_missing_or_foreign_pretrained_file_fails_on_every_rank(tmp_path, pretrained):
    argv = ["--synthetic_rows", 1500, "--train_epochs", 1, "--num_threads", 1, "--ddp", "--nproc_per_node", 2]
    proc = run_cli(tmp_path, *argv, "--adaptation", "--pretrain_model_path", tmp_path / "nope.pth", timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: --pretrain_model_path {tmp_path / 'nope.pth'} not found; pass the checkpoint.pth "
                      "that a pre-training run wrote under its --checkpoints folder"]
    assert "Traceback" not in proc.stderr + proc.stdout
    proc = run_cli(tmp_path, "--synthetic_rows", 1500, "--adaptation", "--pretrain_model_path", pretrained[3])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "does not fit model DLinear: missing: Linear_Seasonal.bias" in proc.stderr
    assert not (tmp_path / "results" / "results.jsonl").exists()


# --subset_rand_ratio outside (0, 1] is refused where it is parsed: tests/test_argument_checks.py
@pytest.mark.parametrize("argv, message", [
    (["--adaptation"], "--adaptation needs --pretrain_model_path PATH"),
    (["--pretrain_model_path", "x.pth"], "--pretrain_model_path is only read with --adaptation"),
    (["--data", "univariate", "--root_path", "/nowhere", "--data_path", "*.csv"],
     "--data_path '*.csv' matches no file under /nowhere"),
    (["--data", "univariate", "--root_path", ".", "--data_path", "*.md"], "--data univariate reads .csv, .txt"),
    (["--data", "univariate", "--features", "MS"], "no covariates for --features MS"),
])
def test_bad_fine_tuning_arguments_are_user_errors(argv, message):
    with pytest.raises(UserError) as caught:
        make_experiment(make_args("--synthetic_rows", 1500, *argv))
    assert message in str(caught.value)


def test_a_series_with_room_for_exactly_one_window_gives_that_window():
    """A split piece of exactly one window's span holds one window (n = 1), not none."""
    import numpy as np

    from data_provider.univariate import UnivariateData
    from data_provider.windows import Window

    window = Window(10, 10, 5)  # 10 rows in, the next 5 out: a span of 15
    assert window.span == 15
    series = [np.arange(100, dtype=np.float32), np.arange(100, dtype=np.float32) + 1000]
    # val starts x_len rows before its border: the second series' val piece is rows 50..65, one span
    data = UnivariateData(series, [(60, 80, 100), (60, 65, 100)])
    val = data.window_dataset("val", window, with_marks=False)
    assert len(val) == (80 - 50 - 15 + 1) + 1
    x, *_ = val.__getitems__(torch.tensor([len(val) - 1]))
    assert x.flatten().tolist() == list(range(1050, 1060))  # the short series' only window
