"""Data provider: splits, scaling, windows, file formats, sharding."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from data_provider import data_factory
from data_provider.data_factory import data_provider, prepared_data
from data_provider.data_loader import Window, WindowDataset, read_table, select_columns, split_ends
from data_provider.scaler import StandardScaler
from helpers import ETTH1, ETTH1_ARGS, EXCHANGE, REPO, make_args
from utils import distributed
from utils.errors import UserError

needs_etth1 = pytest.mark.skipif(not ETTH1.exists(), reason="../shared/datasets/ETT-small/ETTh1.csv not present")


@needs_etth1
def test_etth1_split_sizes_match_the_benchmark_convention():
    args = make_args(*ETTH1_ARGS)
    args.autoregressive = False
    sizes = {flag: len(data_provider(args, flag)[0]) for flag in ("train", "val", "test")}
    # TSLib counts for 96 -> 96: 8640 - 192 + 1, and 2880 + 96 - 192 + 1 for val and test
    assert sizes == {"train": 8449, "val": 2785, "test": 2785}


@needs_etth1
def test_scaler_uses_training_rows_only():
    args = make_args(*ETTH1_ARGS)
    data = prepared_data(args)
    raw = pd.read_csv(ETTH1)[data.columns].to_numpy()
    np.testing.assert_allclose(data.scaler.mean_, raw[:8640].mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(data.scaler.scale_, raw[:8640].std(axis=0), rtol=1e-10)
    # the training rows are standardised, the later rows are not exactly
    assert np.abs(data.values[:8640].mean(axis=0)).max() < 1e-4
    assert data.columns[-1] == "OT"
    assert data.marks.shape == (len(raw), 4)  # hourly: hour, weekday, day of month, day of year


SCALER_CASES = {
    "synthetic": [],
    "ETTh1": ETTH1_ARGS,
    "exchange": ["--data", "custom", "--root_path", str(EXCHANGE.parent), "--data_path", EXCHANGE.name],
}


@pytest.mark.parametrize("case", SCALER_CASES)
def test_scaler_equals_scikit_learns_bit_for_bit(case):
    """data_provider.scaler replaces sklearn.preprocessing.StandardScaler (a second of import per
    process): the same statistics and scaled values to the last bit, so results do not move."""
    from sklearn.preprocessing import StandardScaler as Reference

    argv = SCALER_CASES[case]
    if case != "synthetic" and not (ETTH1 if case == "ETTh1" else EXCHANGE).exists():
        pytest.skip(f"{case} not present")
    args = make_args(*argv)
    values, _ = select_columns(read_table(args), "M", None)
    train_rows = split_ends(args.data, len(values))[0]
    rng = np.random.default_rng(0)
    arrays = {"data": values,  # then: columns constant exactly and up to rounding, float32 input
              "constant columns": np.column_stack([values[:, 0], np.full(len(values), 7.25),
                                                   1e8 + 1e-9 * rng.normal(size=len(values))]),
              "float32": values.astype(np.float32)}
    for name, array in arrays.items():
        ours, reference = StandardScaler().fit(array[:train_rows]), Reference().fit(array[:train_rows])
        for attribute in ("mean_", "var_", "scale_"):
            np.testing.assert_array_equal(getattr(ours, attribute), getattr(reference, attribute), err_msg=name)
        as_float64 = array.astype(np.float64)  # what the data path holds
        np.testing.assert_array_equal(ours.transform(array), reference.transform(as_float64), err_msg=name)
        np.testing.assert_array_equal(ours.inverse_transform(array), reference.inverse_transform(as_float64),
                                      err_msg=name)
    assert list(StandardScaler().fit(arrays["constant columns"]).scale_[1:]) == [1.0, 1.0]


def test_starting_a_run_does_not_import_scikit_learn():
    """What a worker imports before training; scikit-learn (scipy.stats) would add about a second."""
    code = "import sys, run, exp.exp_forecast, models; print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_target_goes_last_and_features_select_columns():
    args = make_args("--target", "x2")
    data = prepared_data(args)
    assert data.columns[-1] == "x2" and len(data.columns) == 7
    args = make_args("--features", "S", "--target", "x2")
    assert prepared_data(args).columns == ["x2"]


def test_synthetic_is_deterministic_from_seed():
    a = prepared_data(make_args("--seed", "3")).values.copy()
    b = prepared_data(make_args("--seed", "4")).values.copy()
    c = prepared_data(make_args("--seed", "5", "--synthetic_seed", "3")).values.copy()
    np.testing.assert_array_equal(a, c)
    assert not np.allclose(a, b)


def test_batched_gather_equals_per_window_slices():
    values = np.random.default_rng(0).normal(size=(300, 3)).astype(np.float32)
    marks = np.random.default_rng(1).normal(size=(300, 4)).astype(np.float32)
    window = Window(x_len=48, y_offset=24, y_len=48)
    dataset = WindowDataset(values, marks, window, "train")
    assert len(dataset) == 300 - 72 + 1
    idx = [0, 5, len(dataset) - 1]
    x, y, xm, ym = dataset.__getitems__(idx)
    for row, start in enumerate(idx):
        np.testing.assert_array_equal(x[row].numpy(), values[start:start + 48])
        np.testing.assert_array_equal(y[row].numpy(), values[start + 24:start + 72])
        np.testing.assert_array_equal(xm[row].numpy(), marks[start:start + 48])
        np.testing.assert_array_equal(ym[row].numpy(), marks[start + 24:start + 72])
        single = dataset[start]
        torch.testing.assert_close(single[1], y[row])
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_token_windows_hold_every_tokens_next_steps():
    args = make_args("--input_token_len", 24, "--output_token_len", 48, "--test_pred_len", 60)
    args.autoregressive = True
    args.test_seq_len = args.seq_len
    dataset, _ = data_provider(args, "train")
    x, y, _, _ = dataset.__getitems__([7])
    assert x.shape[1] == 96 and y.shape[1] == 96 - 24 + 48
    np.testing.assert_array_equal(y[0, :72].numpy(), x[0, 24:].numpy())
    test_set, _ = data_provider(args, "test")
    x, y, _, _ = test_set.__getitems__([0])
    assert x.shape[1] == 96 and y.shape[1] == 60


def test_test_loader_keeps_every_window_even_with_odd_batch():
    args = make_args("--batch_size", 7)
    args.autoregressive = False
    dataset, loader = data_provider(args, "test")
    seen = sum(batch[0].shape[0] for batch in loader)
    assert seen == len(dataset)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 905, 2785])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_cover_each_window_exactly_once(n, world):
    covered = []
    for r in range(world):
        start, stop = distributed.shard_range(n, r, world)
        covered.extend(range(start, stop))
    assert covered == list(range(n))


def test_train_order_changes_with_set_epoch_and_is_reproducible():
    args = make_args()
    args.autoregressive = False
    _, loader = data_provider(args, "train")
    sampler = loader.sampler
    sampler.set_epoch(1)
    first = list(sampler)
    sampler.set_epoch(2)
    second = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) == first and first != second
    assert sorted(first) == list(range(len(loader.dataset)))


@pytest.mark.skipif(not EXCHANGE.exists(), reason="exchange_rate not present")
def test_raw_gzipped_text_file_reads_without_dates():
    args = make_args("--data", "custom", "--root_path", EXCHANGE.parent, "--data_path", EXCHANGE.name)
    data = prepared_data(args)
    assert data.values.shape == (7588, 8) and data.marks.shape == (7588, 0)
    assert data.columns[-1] == "7"  # no OT column: the last column is the target


def test_npy_and_dateless_csv(tmp_path):
    array = np.random.default_rng(0).normal(size=(400, 3))
    np.save(tmp_path / "series.npy", array)
    pd.DataFrame(array, columns=["a", "b", "c"]).to_csv(tmp_path / "plain.csv", index=False)
    pd.DataFrame(array).to_csv(tmp_path / "headerless.csv", index=False, header=False)
    for name, target in (("series.npy", "2"), ("plain.csv", "c"), ("headerless.csv", "2")):
        args = make_args("--data", "custom", "--root_path", tmp_path, "--data_path", name)
        data = prepared_data(args)
        assert data.values.shape == (400, 3) and data.columns[-1] == target, name
        np.testing.assert_allclose(data.scaler.mean_, array[:280].mean(axis=0), rtol=1e-6)


def test_dated_custom_csv_gets_time_features(tmp_path):
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=500, freq="15min"),
                          "load": np.arange(500.0), "OT": np.sin(np.arange(500.0))})
    frame.to_csv(tmp_path / "d.csv", index=False)
    args = make_args("--data", "custom", "--root_path", tmp_path, "--data_path", "d.csv", "--freq", "15min")
    data = prepared_data(args)
    assert data.marks.shape == (500, 5) and data.columns == ["load", "OT"]
    assert data.marks.min() >= -0.5 and data.marks.max() <= 0.5
    # --embed none: no calendar at all, as for undated data (models then build no time-feature embedding)
    data_factory._prepared_cache.clear()
    data = prepared_data(make_args("--data", "custom", "--root_path", tmp_path, "--data_path", "d.csv", "--embed", "none"))
    assert data.marks.shape == (500, 0)


@pytest.mark.parametrize("argv, message", [
    (["--data", "nonsense"], "unknown --data 'nonsense'"),
    (["--data", "custom", "--root_path", "/nowhere", "--data_path", "x.csv"], "data file not found: /nowhere/x.csv"),
    (["--target", "nope"], "--target 'nope' is not a column"),
    (["--features", "MS", "--synthetic_channels", "1"], "--features MS needs covariates"),
    (["--pred_len", "500", "--synthetic_rows", "2000"], "the val split of synthetic has 296 rows, fewer than the 596"),
])
def test_bad_data_arguments_raise_user_errors(argv, message):
    args = make_args(*argv)
    args.autoregressive = False
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        data_provider(args, "val")


def test_nan_and_non_numeric_columns_are_named(tmp_path):
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=50, freq="h"), "a": np.arange(50.0),
                          "OT": np.arange(50.0)})
    frame.loc[3, "a"] = np.nan
    frame.to_csv(tmp_path / "nan.csv", index=False)
    frame.loc[3, "a"] = 1.0
    frame["OT"] = frame["OT"].astype(object)
    frame.loc[5, "OT"] = "oops"
    frame.to_csv(tmp_path / "text.csv", index=False)
    data_factory._prepared_cache.clear()
    with pytest.raises(UserError, match=r"column\(s\) 'a' \(1\)"):
        prepared_data(make_args("--data", "custom", "--root_path", tmp_path, "--data_path", "nan.csv"))
    with pytest.raises(UserError, match="column 'OT' is not numeric"):
        prepared_data(make_args("--data", "custom", "--root_path", tmp_path, "--data_path", "text.csv"))
