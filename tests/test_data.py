"""Data provider: splits, scaling, windows, file formats, sharding."""
import copy
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from data_provider import data_factory
from data_provider.data_factory import data_provider, prepared_data
from data_provider.files import read_file, read_table
from data_provider.splits import split_ends
from data_provider.table import select_columns
from data_provider.windows import Window, WindowDataset
from helpers import ETTH1, ETTH1_ARGS, EXCHANGE, REPO, assert_ok, make_args, records, run_cli
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


@pytest.mark.parametrize("name, rows_per_hour", [("ETTh1", 1), ("ETTh2", 1), ("ETTm1", 4), ("ETTm2", 4)])
def test_ett_borders_are_tslibs_12_4_4_months(name, rows_per_hour):
    from data_provider.splits import split_ends

    month = 30 * 24 * rows_per_hour  # TSLib's Dataset_ETT_hour / Dataset_ETT_minute borders
    assert split_ends(name, 20 * month + 5) == [12 * month, 16 * month, 20 * month]
    assert split_ends("custom", 1000) == [700, 800, 1000]  # other data: 70 / 10 / 20 %


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
def test_scaled_data_equals_scikit_learns_scaler_applied_by_hand(case):
    """The data path scales with scikit-learn's StandardScaler fitted on the training rows: the
    statistics and the scaled values are those of the scaler applied by hand, to the last bit."""
    from sklearn.preprocessing import StandardScaler

    argv = SCALER_CASES[case]
    if case != "synthetic" and not (ETTH1 if case == "ETTh1" else EXCHANGE).exists():
        pytest.skip(f"{case} not present")
    args = make_args(*argv)
    values, _ = select_columns(read_table(args), "M", None)
    train_rows = split_ends(args.data, len(values))[0]
    reference = StandardScaler().fit(values[:train_rows])
    data = prepared_data(args)
    assert isinstance(data.scaler, StandardScaler)
    for attribute in ("mean_", "var_", "scale_"):
        np.testing.assert_array_equal(getattr(data.scaler, attribute), getattr(reference, attribute))
    np.testing.assert_array_equal(data.values, reference.transform(values).astype(np.float32))


def test_univariate_series_equal_scikit_learns_scaler_applied_per_file(tmp_path):
    rng = np.random.default_rng(0)
    files = {"a.csv": rng.normal(5, 2, (400, 2)), "b.csv": rng.normal(-300, 40, (250, 1))}
    for name, array in files.items():
        pd.DataFrame(array).to_csv(tmp_path / name, index=False, header=False)
    data = prepared_data(make_args("--data", "univariate", "--root_path", tmp_path, "--data_path", "*.csv"))
    from sklearn.preprocessing import StandardScaler

    by_hand = [column for array in files.values()
               for column in StandardScaler().fit(array[:int(len(array) * 0.7)]).transform(array).T]
    assert len(data.series) == len(by_hand) == 3
    for ours, reference in zip(data.series, by_hand):
        np.testing.assert_array_equal(ours, reference.astype(np.float32))


def test_starting_a_run_does_not_import_scikit_learn():
    """What a worker imports before training; scikit-learn (scipy.stats) would add about a second,
    so only a process that scales data imports it, inside the function that scales."""
    modules = "run, exp.exp_forecast, models, data_provider.data_factory, data_provider.table, data_provider.univariate"
    code = f"import sys, {modules}; print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
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


def test_synthetic_series_carry_the_daily_and_weekly_cycles_they_promise():
    from data_provider.synthetic import make_synthetic

    frame = make_synthetic(rows=2000)
    weekly = []
    for column in frame.columns[1:]:
        x = frame[column].to_numpy() - frame[column].mean()

        def correlation(lag):
            return np.corrcoef(x[:-lag], x[lag:])[0, 1]

        assert correlation(24) > correlation(12), column  # a day apart alike, half a day apart not
        if column != "OT":  # a week apart more alike than 3 days apart (the same hour of day both)
            weekly.append(correlation(168) - correlation(72))
    assert np.mean(weekly) > 0.1, weekly  # about 0.29; about 0 without the weekly cycle


def test_the_built_in_data_set_is_the_one_the_documented_figures_came_from():
    # every figure in the docs measured on --data synthetic assumes these exact series: a change to
    # data_provider/synthetic.py must be deliberate (and the figures re-measured), never incidental
    from data_provider.synthetic import make_synthetic

    frame = make_synthetic().drop(columns=["date"])
    assert frame.mean().round(4).to_dict() == {"x0": 0.0292, "x1": -1.4076, "x2": 1.4494, "x3": -0.0213,
                                               "x4": 0.3908, "x5": -1.9764, "OT": -1.671}
    assert frame.std().round(4).to_dict() == {"x0": 1.3294, "x1": 0.7525, "x2": 1.3465, "x3": 0.6632,
                                              "x4": 0.8212, "x5": 1.3369, "OT": 1.1377}
    # and --synthetic_channels / --synthetic_rows give their own fixed series (here an even channel count)
    frame = make_synthetic(rows=2000, channels=4).drop(columns=["date"])
    assert frame.mean().round(4).to_dict() == {"x0": -1.3652, "x1": 0.1558, "x2": -0.1948, "OT": -0.1674}
    assert frame.std().round(4).to_dict() == {"x0": 1.3278, "x1": 1.0255, "x2": 1.1463, "OT": 0.6704}


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
    sizes = [batch[0].shape[0] for batch in loader]
    assert sum(sizes) == len(dataset) and sizes[-1] < sizes[0]
    assert len(loader) == len(sizes)  # the short last batch counted, as DataLoader counts it


def test_val_windows_subsets_the_validation_split_alone():
    """--val_windows N bounds what each validation costs; training and the test keep every window."""
    def sizes(*argv):
        args = make_args("--synthetic_rows", 1500, *argv)
        args.autoregressive = False
        return [len(data_provider(args, flag)[0]) for flag in ("train", "val", "test")]

    (train, val, test), subset = sizes(), sizes("--val_windows", 40)
    assert val > 40 and subset == [train, 40, test]


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
    sampler, n = loader.sampler, len(loader.dataset)
    sampler.set_epoch(1)
    first = sampler.order(0, n).tolist()
    sampler.set_epoch(2)
    second = sampler.order(0, n).tolist()
    sampler.set_epoch(1)
    assert sampler.order(0, n).tolist() == first and first != second
    assert sorted(first) == list(range(n))


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


def test_time_features_are_tslibs_calendar_fractions():
    """timeF: each feature is (value - first) / (count - 1) - 0.5 as TSLib's; 2021-03-07 is a Sunday, day 66
    of the year (an even day: day - 1 and day ^ 1 differ), ISO week 9."""
    from data_provider.timefeatures import time_features

    dates = pd.Series([pd.Timestamp("2021-03-07 07:08:09")])
    second, minute, hour, weekday, monthday, yearday = 9 / 59, 8 / 59, 7 / 23, 6 / 6, 6 / 30, 65 / 365
    np.testing.assert_allclose(time_features(dates, "s")[0] + 0.5,
                               [second, minute, hour, weekday, monthday, yearday], rtol=1e-6)
    np.testing.assert_allclose(time_features(dates, "15min")[0] + 0.5, [minute, hour, weekday, monthday, yearday],
                               rtol=1e-6)
    np.testing.assert_allclose(time_features(dates, "w")[0] + 0.5, [monthday, 8 / 52], rtol=1e-6)
    np.testing.assert_allclose(time_features(dates, "m")[0] + 0.5, [2 / 11], rtol=1e-6)
    assert time_features(dates, "y").shape == (1, 0)


def test_future_dates_continue_at_freq():
    from data_provider.timefeatures import future_dates, freq_offset

    assert list(future_dates("2018-06-26 19:45", "15min", 2)) == [pd.Timestamp("2018-06-26 20:00"),
                                                                   pd.Timestamp("2018-06-26 20:15")]
    assert list(future_dates("2020-01-31", "m", 3)) == list(pd.to_datetime(["2020-02-29", "2020-03-31", "2020-04-30"]))
    assert list(future_dates("2020-01-03", "b", 1)) == [pd.Timestamp("2020-01-06")]  # Friday -> Monday
    assert pd.Timestamp("2021-01-01") + freq_offset("120min") == pd.Timestamp("2021-01-01 02:00")  # 3 digits
    assert len(future_dates("2021-01-01", "h", 5)) == 5  # an odd horizon too


@pytest.mark.parametrize("embed", ["fixed", "learned"])
def test_integer_time_features_for_tslibs_fixed_and_learned_embeddings(embed):
    from data_provider.timefeatures import time_features

    dates = pd.Series(pd.date_range("2021-03-05 06:00", periods=3, freq="15min"))
    np.testing.assert_array_equal(time_features(dates, "h", embed), [[3, 5, 4, 6]] * 3)  # month, day, weekday, hour
    np.testing.assert_array_equal(time_features(dates, "15min", embed)[:, -1], [0, 1, 2])  # + quarter hour
    assert time_features(dates, "h", "none").shape == (3, 0)


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


def test_dates_whose_offset_changes_with_daylight_saving_are_refused_saying_how_to_write_them(tmp_path):
    """pandas refuses them even when asked to coerce (once a raw traceback), advising "Pass utc=True", which
    no run.py argument does: the line names the change and how to write the file; written so, it is read."""
    frame = pd.DataFrame({"date": pd.date_range("2021-03-28", periods=6, freq="h", tz="Europe/Berlin").astype(str),
                          "a": np.arange(6.0)})
    frame.to_csv(tmp_path / "zones.csv", index=False)
    with pytest.raises(UserError) as refused:
        read_file(str(tmp_path / "zones.csv"))
    assert str(refused.value) == (
        f"{tmp_path / 'zones.csv'}: the 'date' column's UTC offset changes ('2021-03-28 00:00:00+01:00' in row 1, "
        "'2021-03-28 03:00:00+02:00' in row 3; daylight saving time?), and run.py reads one offset per file: write "
        "the column in UTC (in pandas: df['date'] = pd.to_datetime(df['date'], utc=True)), or remove it")
    frame["date"] = pd.to_datetime(frame["date"], utc=True)  # as the message says
    frame.to_csv(tmp_path / "utc.csv", index=False)
    table = read_file(str(tmp_path / "utc.csv"))
    assert list(table.dates.dt.hour) == [23, 0, 1, 2, 3, 4] and table.values[:, 0].tolist() == list(range(6))


# ---------------------------------------------------------------- how a CSV is written
def _etth1_like(rows=400):
    """Dates and values with many digits (as a spreadsheet's float64 values are), in a fixed order."""
    values = np.random.default_rng(3).normal(size=(rows, 3)) * [1.0, 30.0, 1e-3]
    frame = pd.DataFrame(values, columns=["HUFL", "MUFL", "OT"])
    frame.insert(0, "date", pd.date_range("2016-07-01", periods=rows, freq="h").astype(str))
    return frame


@pytest.mark.parametrize("sep, decimal, header", [(";", ",", True), (";", ",", False), ("\t", ".", True),
                                                  (";", ".", True), ("|", ",", True)])
def test_a_csv_separated_otherwise_or_with_decimal_commas_reads_as_the_comma_csv(tmp_path, sep, decimal, header):
    """European spreadsheet exports (sep ';', decimal ','), tab-separated files: the same table as the comma CSV
    (this ETTh1-like file was once read as one column 'date;HUFL;MUFL;OT' holding the digits after a comma)."""
    frame = _etth1_like() if header else _etth1_like().drop(columns=["date"])
    frame.to_csv(tmp_path / "comma.csv", index=False, header=header)
    frame.to_csv(tmp_path / "other.csv", index=False, header=header, sep=sep, decimal=decimal)
    expected, table = read_file(str(tmp_path / "comma.csv")), read_file(str(tmp_path / "other.csv"))
    assert table.columns == expected.columns == (["HUFL", "MUFL", "OT"] if header else ["0", "1", "2"])
    np.testing.assert_array_equal(table.values, expected.values)
    np.testing.assert_array_equal(table.values, frame[frame.columns[-3:]].to_numpy())
    assert (table.dates is None) == (not header) and (not header or table.dates.equals(expected.dates))


def test_a_csv_whose_decimal_mark_is_unclear_is_refused_in_one_line(tmp_path):
    """Decimal commas beside decimal points (which is the thousands separator?), and decimal commas in a file
    separated by ',' (rows longer than the header, whose leading fields pandas would make an index): refused,
    never guessed."""
    frame = _etth1_like()
    frame["MUFL"] = frame["MUFL"].map("{:.3f}".format)  # a column pasted in with decimal points
    frame.to_csv(tmp_path / "mixed.csv", index=False, sep=";", decimal=",")
    with pytest.raises(UserError) as refused:
        read_file(str(tmp_path / "mixed.csv"))
    assert str(refused.value) == (f"{tmp_path / 'mixed.csv'}: column 'MUFL' holds '{frame.loc[0, 'MUFL']}' (row 1) "
                                  "with a decimal point, where the file's other numbers have decimal commas; write "
                                  "every number with the same decimal mark and no thousands separators")
    for name, text in (("one.csv", "OT\n0,5\n1,5\n2,5\n"), ("dated.csv", "date,OT\n2021-01-01,0,5\n2021-01-02,1,5\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match="its rows have more fields than its header .fields separated by ','.; "
                                            "decimal commas in a file separated by ','"):
            read_file(str(tmp_path / name))


def test_an_unnamed_row_index_column_is_dropped_with_one_warning_and_the_run_equals_the_run_without_it(tmp_path):
    """df.to_csv(path) writes the row index as a first column with an empty header ('Unnamed: 0'), once trained
    as a channel (enc_in 5 instead of 4): dropped, one warning line on 2 processes, the run the same as on the file
    without it."""
    frame = _etth1_like(rows=600)
    frame.to_csv(tmp_path / "plain.csv", index=False)
    frame.to_csv(tmp_path / "indexed.csv")
    runs = {}
    for name in ("indexed.csv", "plain.csv"):
        folder = tmp_path / name.split(".")[0]
        proc = run_cli(folder, "--data", "custom", "--root_path", tmp_path, "--data_path", name, "--seq_len", 48,
                       "--label_len", 24, "--pred_len", 24, "--train_epochs", 1, "--num_threads", 1, nproc=2)
        assert_ok(proc)
        runs[name] = records(folder)[0]
        output = proc.stdout + proc.stderr
        warnings = [line for line in output.splitlines() if line.startswith("warning:") and "Unnamed" in line]
        assert warnings == ([f"warning: {tmp_path / name}: dropped column 'Unnamed: 0', a row index without a name "
                             "(as df.to_csv(path) writes it); write the file with df.to_csv(path, index=False) to "
                             "leave it out"] if name == "indexed.csv" else []), output
    indexed, plain = runs["indexed.csv"], runs["plain.csv"]
    assert indexed["args"]["enc_in"] == plain["args"]["enc_in"] == 3
    assert [indexed[k] for k in ("mse", "mae", "vali_loss")] == [plain[k] for k in ("mse", "mae", "vali_loss")]


def test_an_unnamed_column_that_is_no_row_index_is_refused_naming_it(tmp_path):
    frame = _etth1_like()
    frame.index = frame.index * 2  # an index that skips rows: data, or not, nobody can tell
    frame.to_csv(tmp_path / "skips.csv")
    with pytest.raises(UserError) as refused:
        read_file(str(tmp_path / "skips.csv"))
    assert str(refused.value) == (f"{tmp_path / 'skips.csv'}: column 1 has no name in the header (pandas calls it "
                                  "'Unnamed: 0') and is not a row index; name it in the header ('date' if it holds "
                                  "the timestamps), or remove it")



def test_a_csv_whose_header_is_pandas_column_numbers_keeps_it_and_runs_as_the_npy(tmp_path):
    """pd.DataFrame(array).to_csv(path, index=False) writes the header 0,1,2, once taken for a file without a
    header: its row [0, 1, 2] was trained on (1001 rows; here mape 1.562 against 1.374 for the same array as .npy).
    The header stays the column names, and the run is the .npy's."""
    array = np.random.default_rng(0).normal(size=(1000, 3))
    np.save(tmp_path / "array.npy", array)
    pd.DataFrame(array).to_csv(tmp_path / "array.csv", index=False)
    pd.Series(array[:, 0]).to_csv(tmp_path / "series.csv", index=False)  # one column: the header '0'
    table, npy = read_file(str(tmp_path / "array.csv")), read_file(str(tmp_path / "array.npy"))
    assert table.columns == npy.columns == ["0", "1", "2"]
    np.testing.assert_array_equal(table.values, npy.values)
    np.testing.assert_array_equal(read_file(str(tmp_path / "series.csv")).values, array[:, :1])
    runs = {}
    for name in ("array.csv", "array.npy"):
        folder = tmp_path / name.replace(".", "_")
        proc = run_cli(folder, "--data", "custom", "--root_path", tmp_path, "--data_path", name, "--seq_len", 48,
                       "--label_len", 24, "--pred_len", 24, "--train_epochs", 1, "--num_threads", 1)
        assert_ok(proc)
        runs[name] = records(folder)[0]
    assert runs["array.csv"]["args"]["enc_in"] == 3
    assert [runs["array.csv"][k] for k in ("mse", "mae", "vali_loss")] == \
        [runs["array.npy"][k] for k in ("mse", "mae", "vali_loss")]


def test_a_csv_without_a_header_is_still_read_whole_and_a_header_of_numbers_over_integers_is_refused(tmp_path):
    """Files without a header, as np.savetxt and to_csv(header=False) write them, keep their first row; numbers
    that are not 0, 1, ... are a row too. A first line 0,1 over integer values could be either: refused."""
    array = np.random.default_rng(1).normal(size=(50, 2))
    np.savetxt(tmp_path / "savetxt.csv", array, delimiter=",")
    pd.DataFrame(array).to_csv(tmp_path / "no_header.csv", index=False, header=False)
    (tmp_path / "counts.csv").write_text("1,2\n3,4\n5,6\n")
    for name in ("savetxt.csv", "no_header.csv"):
        table = read_file(str(tmp_path / name))
        assert table.columns == ["0", "1"] and len(table.values) == 50, name
        np.testing.assert_allclose(table.values, array, rtol=1e-15)
    np.testing.assert_array_equal(read_file(str(tmp_path / "counts.csv")).values, [[1, 2], [3, 4], [5, 6]])
    pd.DataFrame(np.arange(10).reshape(5, 2)).to_csv(tmp_path / "integers.csv", index=False)
    with pytest.raises(UserError) as refused:
        read_file(str(tmp_path / "integers.csv"))
    assert str(refused.value) == (
        f"{tmp_path / 'integers.csv'}: its first line '0,1' may be a header (the column names pandas writes for a "
        "frame made from an array) or a row of data (every value below it is an integer); give the columns names "
        "that are not numbers in a header row (e.g. df.columns = [f'x{i}' for i in df.columns] before "
        "df.to_csv(path, index=False)), or save the array as .npy")



def _dated_as(folder, name, dates, written):
    """A CSV of `dates` written in strftime format `written`, two columns of values."""
    n = len(dates)
    pd.DataFrame({"date": dates.strftime(written), "a": np.cos(np.arange(n) / 7), "OT": np.sin(np.arange(n) / 5)}).to_csv(
        folder / name, index=False)
    return ["--data", "custom", "--root_path", folder, "--data_path", name]


def test_dates_whose_day_and_month_could_be_either_way_round_are_read_in_the_order_the_column_shows(tmp_path):
    """12 days of hours written day first (01.07.2016 00:00 ...), no day past 12, were read month first: January
    to December at irregular steps, and --do_predict dated its forecast 2016-12-08 (truth 2016-07-13). The whole
    column decides: month first its steps are irregular, so day first; a US file (07/01/2016) stays month first.
    The calendar features and the forecast's dates are those of the same file written in ISO 8601."""
    hours = pd.date_range("2016-07-01", periods=12 * 24, freq="h")
    argv = {"day first": _dated_as(tmp_path, "day.csv", hours, "%d.%m.%Y %H:%M"),
            "month first": _dated_as(tmp_path, "us.csv", hours, "%m/%d/%Y %H:%M"),
            "told": [*_dated_as(tmp_path, "day.csv", hours, "%d.%m.%Y %H:%M"), "--date_format", "%d.%m.%Y %H:%M"],
            "ISO 8601": _dated_as(tmp_path, "iso.csv", hours, "%Y-%m-%d %H:%M:%S")}
    read = {}
    for kind, data_argv in argv.items():
        data_factory._prepared_cache.clear()
        args = make_args(*data_argv, "--seq_len", 48, "--label_len", 24, "--pred_len", 24)
        args.autoregressive = False
        data = prepared_data(args)
        future = data.future_input(data_factory.window_for(args, "test"), args.freq, args.embed)
        read[kind] = data.dates, data.marks, list(future[1])
    for kind, (dates, marks, forecast_dates) in read.items():
        assert list(dates) == list(hours), kind
        np.testing.assert_array_equal(marks, read["ISO 8601"][1])
        assert forecast_dates[0] == pd.Timestamp("2016-07-13 00:00") and forecast_dates == read["ISO 8601"][2], kind


def test_do_predict_dates_a_day_first_forecast_after_the_last_day(tmp_path):
    hours = pd.date_range("2016-07-01", periods=12 * 24, freq="h")
    proc = run_cli(tmp_path, *_dated_as(tmp_path, "day.csv", hours, "%d.%m.%Y %H:%M"), "--seq_len", 48,
                   "--label_len", 24, "--pred_len", 24, "--train_epochs", 1, "--num_threads", 1, "--do_predict")
    assert_ok(proc)
    forecast = pd.read_csv(tmp_path / "results" / records(tmp_path)[0]["setting"] / "forecast.csv", parse_dates=["date"])
    assert list(forecast["date"]) == list(pd.date_range("2016-07-13", periods=24, freq="h"))


def test_a_date_order_the_column_cannot_decide_is_refused_naming_date_format(tmp_path):
    """Ten days written day first read as ten months just as regularly: refused, naming --date_format, which then
    reads it. A day-first file that reaches day 13 reads day first; told month first, the line says the dates are
    day first. A value neither order reads is named, with the order the rows before it are in."""
    ten_days = pd.date_range("2016-07-01", periods=10, freq="D")
    _dated_as(tmp_path, "days.csv", ten_days, "%d.%m.%Y")
    path = str(tmp_path / "days.csv")
    with pytest.raises(UserError) as refused:
        read_file(path)
    assert str(refused.value) == (f"{path}: the 'date' column reads as dates with the day first or the month first "
                                  "alike ('01.07.2016' is 1 July 2016 or 7 January 2016), at regular steps both ways; "
                                  "give the order with --date_format '%d.%m.%Y' (day first) or '%m.%d.%Y' (month first)")
    assert list(read_file(path, "%d.%m.%Y").dates) == list(ten_days)
    assert list(read_file(path, dates_used=False).values[:, 0]) == list(np.cos(np.arange(10) / 7))  # a corpus' file
    weeks = pd.date_range("2016-07-01", periods=17 * 24, freq="h")  # to 17.07.2016
    _dated_as(tmp_path, "weeks.csv", weeks, "%d.%m.%Y %H:%M")
    path = str(tmp_path / "weeks.csv")
    assert list(read_file(path).dates) == list(weeks)
    with pytest.raises(UserError) as refused:
        read_file(path, "%m.%d.%Y %H:%M")
    assert str(refused.value) == (f"{path}: the 'date' column does not match --date_format '%m.%d.%Y %H:%M' "
                                  "('13.07.2016 00:00' in row 289): the dates are day first, which --date_format "
                                  "'%d.%m.%Y %H:%M' reads; give the format the column is written in, or leave "
                                  "--date_format out")
    frame = pd.read_csv(path)
    frame.loc[350, "date"] = "15.07.2016 14:00 h"
    frame.to_csv(tmp_path / "typo.csv", index=False)
    with pytest.raises(UserError) as refused:
        read_file(str(tmp_path / "typo.csv"))
    assert str(refused.value) == (f"{tmp_path / 'typo.csv'}: the 'date' column cannot be parsed as timestamps "
                                  "('15.07.2016 14:00 h' in row 351; the dates before it are day first "
                                  "('%d.%m.%Y %H:%M'), not month first as pandas reads them); fix the column or "
                                  "remove it")


# ---------------------------------------------------------------- the data interface, on both kinds
def _univariate_corpus(folder, rows=(600, 400)):
    folder.mkdir(exist_ok=True)
    for i, n in enumerate(rows):
        pd.DataFrame({"v": np.sin(np.arange(n) / (5.0 + i))}).to_csv(folder / f"s{i}.csv", index=False)
    return ["--data", "univariate", "--root_path", folder, "--data_path", "*.csv"]


def _undated_csv(folder):
    pd.DataFrame(np.random.default_rng(0).normal(size=(500, 3)), columns=["a", "b", "c"]).to_csv(
        folder / "plain.csv", index=False)
    return ["--data", "custom", "--root_path", folder, "--data_path", "plain.csv", "--scale", "false"]


@pytest.mark.parametrize("kind", ["dated table", "undated table", "univariate"])
def test_both_kinds_answer_every_member_of_the_data_interface(tmp_path, kind):
    from sklearn.preprocessing import StandardScaler

    from data_provider.interface import ForecastData

    argv = {"dated table": [], "undated table": _undated_csv(tmp_path),
            "univariate": _univariate_corpus(tmp_path / "corpus")}[kind]
    args = make_args(*argv, "--seq_len", 48, "--label_len", 24, "--pred_len", 24)
    args.autoregressive = False
    data = prepared_data(args)
    assert isinstance(data, ForecastData) and all(hasattr(data, member) for member in ForecastData.MEMBERS)
    assert data.columns == {"dated table": [f"x{i}" for i in range(6)] + ["OT"], "undated table": ["a", "b", "c"],
                            "univariate": ["value"]}[kind]
    assert data.mark_dim == (4 if kind == "dated table" else 0)  # hourly: hour, weekday, day of month, day of year
    assert isinstance(data.scaler, StandardScaler) if kind == "dated table" else data.scaler is None
    assert data.per_series_scaling is (kind == "univariate")
    assert isinstance(data.dates, pd.Series) if kind == "dated table" else data.dates is None
    window = data_factory.window_for(args, "test")
    dataset = data.window_dataset("test", window)
    x, y, x_mark, y_mark = dataset.__getitems__([0, 1])
    assert x.shape == (2, 48, len(data.columns)) and y.shape == (2, 48, len(data.columns))
    assert x_mark.shape == (2, 48, data.mark_dim) and y_mark.shape == (2, 48, data.mark_dim)
    assert data.window_dataset("test", window, with_marks=False).__getitems__([0])[2:] == (None, None)
    if kind == "dated table":  # window i of test forecasts from the row after its input
        assert data.forecast_date("test", window, 0) == data.dates.iloc[data.ends[1]]
        assert data.forecast_date("test", window, 5) == data.dates.iloc[data.ends[1] + 5]
    else:
        assert data.forecast_date("test", window, 0) is None
    if kind == "univariate":
        with pytest.raises(UserError, match="no single original scale") as refused:
            data.future_input(window, args.freq, args.embed)
        assert "\n" not in str(refused.value)
    else:
        future, index, last_row = data.future_input(window, args.freq, args.embed)
        assert len(future) == 1 and len(index) == 24
    digest = data.content_hash()  # what last.pth records and the ranks compare: cached, and the content's
    assert len(digest) == 16 and data.content_hash() is digest
    changed = copy.deepcopy(data)  # never the per-process cached data itself
    changed._content_hash = None
    (changed.series[0] if kind == "univariate" else changed.values)[3] += 1e-3
    assert changed.content_hash() != digest


@pytest.mark.parametrize("kind", ["dated", "undated"])
@pytest.mark.parametrize("autoregressive", [False, True])
def test_future_input_is_the_last_rows_then_the_horizon_as_predict_built_it(tmp_path, kind, autoregressive, caplog):
    """The one window after the data's end: the same tensors predict() built by hand before (and no
    warning about irregular dates: the built-in data's last two are one --freq step apart)."""
    from data_provider.timefeatures import future_dates, time_features

    argv = [] if kind == "dated" else _undated_csv(tmp_path)
    args = make_args(*argv, "--seq_len", 48, "--label_len", 24, "--pred_len", 12, "--input_token_len", 24,
                     "--output_token_len", 24)
    args.autoregressive, args.test_seq_len, args.test_pred_len = autoregressive, 48, 12
    data = prepared_data(args)
    window = data_factory.window_for(args, "test")
    with caplog.at_level("WARNING", logger="tsl"):
        future, index, last_row = data.future_input(window, args.freq, args.embed)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    values = np.concatenate([data.values[-48:], np.zeros((12, data.values.shape[1]), np.float32)])
    if kind == "dated":
        assert index.name == "date" and last_row == f"{data.dates.iloc[-1]}"
        assert list(index) == list(future_dates(data.dates.iloc[-1], args.freq, 12))
        future_marks = time_features(index, args.freq, args.embed)
    else:
        assert list(index) == list(range(1, 13)) and index.name == "step" and last_row == "row 500"
        future_marks = np.zeros((12, 0), np.float32)
    marks = np.concatenate([data.marks[-48:], future_marks])
    expected = [values[:48], values[window.y_offset:window.y_offset + window.y_len],
                marks[:48], marks[window.y_offset:window.y_offset + window.y_len]]
    assert len(future) == 1
    for got, want in zip(future.__getitems__([0]), expected):
        assert got.is_contiguous() and got.dtype == torch.float32
        torch.testing.assert_close(got, torch.from_numpy(want)[None], rtol=0, atol=0)


def test_future_input_warns_of_an_irregular_end_and_refuses_short_data(tmp_path, monkeypatch):
    from data_provider import table

    dates = list(pd.date_range("2021-01-01", periods=99, freq="h")) + [pd.Timestamp("2021-01-05 09:00")]
    pd.DataFrame({"date": dates, "OT": np.arange(100.0)}).to_csv(tmp_path / "gap.csv", index=False)
    args = make_args("--data", "custom", "--root_path", tmp_path, "--data_path", "gap.csv", "--seq_len", 24,
                     "--label_len", 12, "--pred_len", 6)
    args.autoregressive = False
    warnings = []
    monkeypatch.setattr(table.logger, "warning", warnings.append)
    _, index, _ = prepared_data(args).future_input(data_factory.window_for(args, "test"), "h", "timeF")
    assert index[0] == pd.Timestamp("2021-01-05 10:00")
    assert warnings == ["the data's last two dates are 2021-01-05 02:00:00 and 2021-01-05 09:00:00, which "
                        "is not one --freq h step; forecast.csv continues at --freq h anyway"]
    args.seq_len = 200
    with pytest.raises(UserError, match="^--do_predict needs the last 200 rows as input; the data has 100$"):
        prepared_data(args).future_input(data_factory.window_for(args, "test"), "h", "timeF")


@pytest.mark.parametrize("kind", ["table", "univariate"])
def test_a_split_without_a_window_names_the_split_its_rows_and_the_window_span(tmp_path, kind):
    argv = (["--synthetic_rows", 2000] if kind == "table"
            else _univariate_corpus(tmp_path / "corpus", rows=(2000, 1000)))
    args = make_args(*argv, "--pred_len", 500)
    args.autoregressive = False
    name = "synthetic" if kind == "table" else "univariate"
    rows = "296 rows" if kind == "table" else "at most 296 rows per series"
    with pytest.raises(UserError) as caught:
        data_provider(args, "val")
    assert str(caught.value) == (f"the val split of {name} has {rows}, fewer than the 596 one window needs "
                                 f"(seq_len 96 + horizon); shorten --seq_len/--pred_len or "
                                 f"{'use a longer series' if kind == 'table' else 'add longer series'}")


def test_a_file_of_one_data_row_is_read(tmp_path):
    """The header-only check refuses a file with no rows, not one with a single row (too short for a
    window, which a later check says in its own words)."""
    from data_provider.files import read_file

    path = tmp_path / "one_row.csv"
    path.write_text("date,a,OT\n2021-01-01 00:00:00,1.5,2.5\n")
    assert len(read_file(str(path)).values) == 1


def test_time_features_follow_embed_as_typed_on_the_command_line():
    """`--embed timeF` parsed from a command line (a string argparse built, not an interned literal)
    selects the timeF features: [hour, weekday, day of month, day of year] scaled to [-0.5, 0.5]."""
    import shlex

    from data_provider.timefeatures import time_features

    args = make_args(*shlex.split("--embed timeF --freq h"))
    assert args.embed == "timeF" and args.embed is not "timeF"  # noqa: F632 (the point of the test)
    features = time_features(pd.date_range("2021-01-01", periods=5, freq="h"), args.freq, args.embed)
    assert features.shape == (5, 4) and np.abs(features).max() <= 0.5


def test_a_split_whose_history_reaches_before_the_first_row_starts_at_row_0():
    """val/test start x_len rows before their border, but never before the file's first row (not row 1)."""
    from data_provider.splits import split_start

    assert split_start((50, 80, 100), "val", 96) == 0
    assert split_start((50, 80, 100), "test", 96) == 0
    assert split_start((500, 800, 1000), "val", 96) == 404 and split_start((500, 800, 1000), "train", 96) == 0
