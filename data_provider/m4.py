"""`--data m4` (with `--task_name short_term_forecast --seasonal_patterns P`): one M4 frequency, as TSLib
forecasts it (thuml/Time-Series-Library 4e938a1: data_provider/m4.py, Dataset_M4; facts only, no code).

The data is not shipped. --root_path holds M4-info.csv (M4id, SP, Frequency, Horizon columns) and either
TSLib's pair training.npz / test.npz (one row per series of M4-info.csv, in its order, as TSLib's
download gives them) or the competition's own CSVs, <P>-train.csv and <P>-test.csv per frequency (the
series' id first, then its values; docs/data.md). Optionally M4's submission-Naive2.csv (utils.m4).

Windows, TSLib's rules (seq_len = 2 x horizon, label_len = horizon; exp.settings sets them):
- train: one window per series and epoch, cut at a point drawn uniformly from the series' last
  history_size x horizon steps (at least one step in); the input is the seq_len steps before the cut,
  zero-padded in front, the target the label_len steps before it and the horizon after it, left-aligned
  and zero-padded behind, as TSLib's __getitem__ lays them. TSLib draws the cut with np.random; here it
  is a hash of (--seed, epoch, series), so the same window trains whichever process takes it.
  Target steps past the series' end are NaN in the horizon (they are TSLib's mask 0: the losses of
  utils.metrics leave them out, counting them in the mean as TSLib's masked mean does).
- val and test: one window per series, the last seq_len steps of its training part (zero-padded in
  front), the target its test horizon. TSLib validates on the test set too (its Dataset_M4 reads the
  test file for every flag but train); the same here, so its scripts' early stopping is TSLib's.
"""
import os

import numpy as np
import torch

from data_provider.interface import ForecastData
from data_provider.permutation import epoch_key
from utils.errors import UserError, require
from utils.keyed_random import splitmix64_finaliser
from utils.m4 import FREQUENCIES, HISTORY_SIZE, HORIZONS, SEASONAL_PATTERNS, M4Sets, check_pattern

M4 = "m4"
INFO_FILE = "M4-info.csv"


def read_info(root_path):
    import pandas as pd

    path = os.path.join(root_path, INFO_FILE)
    require(os.path.isfile(path), f"--data m4 reads M4's files under --root_path {root_path}, which has no {INFO_FILE}; "
                                  "lay out M4 as docs/data.md#m4 says (M4-info.csv with training.npz and test.npz, or "
                                  "<Frequency>-train.csv and <Frequency>-test.csv)")
    info = pd.read_csv(path)
    missing = [c for c in ("M4id", "SP", "Frequency") if c not in info.columns]
    require(not missing, f"{path} lacks the column {missing[0] if missing else ''} (M4-info.csv has M4id, SP, Frequency)")
    return info


def _rows(values):
    """Each row of an object or NaN-padded array as float64, its NaN padding dropped."""
    rows = []
    for v in values:
        v = np.asarray(v, dtype=np.float64)
        rows.append(v[~np.isnan(v)])
    return rows


def _read_pickled(path, n):
    """TSLib's training.npz / test.npz: an array (of objects) with one row per line of M4-info.csv."""
    try:
        values = np.load(path, allow_pickle=True)  # TSLib's files are pickled object arrays, read as TSLib reads them
    except Exception as problem:
        raise UserError(f"{path} is not TSLib's M4 file (a numpy array of the series): {problem}") from None
    require(len(values) == n, f"{path} holds {len(values)} series, but {INFO_FILE} lists {n}")
    return values


def _read_csv(path):
    import pandas as pd

    frame = pd.read_csv(path)
    return [str(i) for i in frame.iloc[:, 0]], _rows(frame.iloc[:, 1:].to_numpy(dtype=np.float64))


def read_m4(root_path, pattern=None):
    """(ids, train, test, sets) of the frequencies `pattern` names (every one for None): ids and training
    series (float64) per frequency, each frequency's test horizons [series, horizon], and utils.m4.M4Sets."""
    info = read_info(root_path)
    groups = info.SP.astype(str).to_numpy()
    patterns = SEASONAL_PATTERNS if pattern is None else (pattern,)
    counts = {p: int((groups == p).sum()) for p in SEASONAL_PATTERNS}
    frequency = {}
    for p in patterns:
        require(counts[p] > 0, f"{os.path.join(root_path, INFO_FILE)} lists no {p} series")
        frequency[p] = int(info.Frequency[groups == p].iloc[0])
    npz = [os.path.join(root_path, f) for f in ("training.npz", "test.npz")]
    if all(map(os.path.isfile, npz)):
        train_all, test_all = (_read_pickled(f, len(info)) for f in npz)
        ids = {p: info.M4id[groups == p].astype(str).tolist() for p in patterns}
        train = {p: _rows(train_all[groups == p]) for p in patterns}
        test = {p: _rows(test_all[groups == p]) for p in patterns}
    else:
        ids, train, test = {}, {}, {}
        for p in patterns:
            files = [os.path.join(root_path, f"{p}-{part}.csv") for part in ("train", "test")]
            lacking = [f for f in npz + files if not os.path.isfile(f)]
            require(len(lacking) < 4, f"--data m4 --seasonal_patterns {p}: --root_path {root_path} has neither "
                                      f"TSLib's training.npz and test.npz nor M4's {p}-train.csv and {p}-test.csv "
                                      "(docs/data.md#m4)")
            ids[p], train[p] = _read_csv(files[0])
            test_ids, test[p] = _read_csv(files[1])
            require(test_ids == ids[p], f"{files[1]} does not list the series of {files[0]} in the same order")
    targets = {}
    for p in patterns:
        horizon = {len(t) for t in test[p]}
        require(len(horizon) == 1, f"the {p} test horizons differ in length ({sorted(horizon)}); M4's are all "
                                   "one frequency's horizon")
        require(len(test[p]) == len(train[p]) > 0, f"{p}: {len(train[p])} training series, {len(test[p])} test ones")
        short = [i for i, s in zip(ids[p], train[p]) if len(s) <= frequency[p]]
        require(not short, f"{p} series {short[0] if short else ''} has no more training values than its frequency "
                           f"{frequency[p]}: MASE's scale needs at least {frequency[p] + 1}")
        targets[p] = np.stack(test[p])
    return ids, train, targets, M4Sets(counts, frequency, train, targets)


def _uniform(key, series, low, high):
    """A draw in [low, high) per series from a hash of (key, series): TSLib's np.random cut point, keyed."""
    with np.errstate(over="ignore"):
        mixed_key = splitmix64_finaliser(np.full(len(series), key % 2**64, dtype=np.uint64))
        h = splitmix64_finaliser(np.asarray(series, dtype=np.uint64) ^ mixed_key)
    return low + (h % (high - low).astype(np.uint64)).astype(np.int64)


class M4Windows(torch.utils.data.Dataset):
    """One window per series; train: cut at a keyed random point (set_epoch chooses the epoch's), else at
    the end of the training part, scored against the test horizon. A batch is (x, y, None, None)."""

    def __init__(self, series, window, split, history_size, targets=None):
        self.series, self.window, self.split, self.targets = series, window, split, targets
        self.label_len = window.x_len - window.y_offset
        self.pred_len = window.y_len - self.label_len
        self.lengths = np.array([len(s) for s in series], dtype=np.int64)
        self.limit = int(history_size * self.pred_len)  # TSLib's window_sampling_limit
        self.seed, self.epoch = 0, 0

    def __len__(self):
        return len(self.series)

    @property
    def device(self):
        return torch.device("cpu")

    def to(self, device):
        return self  # gathered per batch on the host (one small window per series)

    def set_seed(self, seed):
        self.seed = seed

    def set_epoch(self, epoch):
        self.epoch = epoch

    def cut_points(self, indices):
        n = self.lengths[indices]
        low = np.maximum(1, n - self.limit)
        return _uniform(epoch_key(self.seed, self.epoch), indices, low, n)

    def __getitems__(self, indices):
        indices = np.asarray(indices.cpu() if torch.is_tensor(indices) else indices, dtype=np.int64)
        x = np.zeros((len(indices), self.window.x_len, 1), dtype=np.float32)
        y = np.zeros((len(indices), self.window.y_len, 1), dtype=np.float32)
        train = self.split == "train"
        cuts = self.cut_points(indices) if train else self.lengths[indices]
        for row, (i, cut) in enumerate(zip(indices, cuts)):
            s = self.series[i]
            before = s[max(0, cut - self.window.x_len):cut]
            x[row, self.window.x_len - len(before):, 0] = before
            if train:
                after = s[max(0, cut - self.label_len):min(len(s), cut + self.pred_len)]
                y[row, :len(after), 0] = after
                y[row, max(len(after), self.label_len):, 0] = np.nan  # TSLib's mask 0 in the horizon
            else:  # the decoder's known steps, as TSLib's vali and test take them (x's last label_len), then the test
                y[row, :self.label_len, 0] = x[row, self.window.x_len - self.label_len:, 0]
                y[row, self.label_len:, 0] = self.targets[i]
        return torch.from_numpy(x), torch.from_numpy(y), None, None

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        return tuple(None if t is None else t[0] for t in self.__getitems__([index]))


class M4Data(ForecastData):
    """One M4 frequency (--seasonal_patterns): its training series and test horizons, unscaled (TSLib's)."""

    columns = ["value"]
    mark_dim = 0  # TSLib's M4 models see no time features (its loop passes None)
    scaler = None
    per_series_scaling = True  # no single original scale: --inverse and --do_predict refuse
    dates = None
    stays_on_host = "M4's windows are cut on the host, batch by batch"  # M4Windows.to: never on a GPU

    def __init__(self, root_path, pattern):
        self.root_path, self.pattern = root_path, pattern
        ids, train, targets, self.sets = read_m4(root_path, pattern)
        self.ids, self.series, self.targets = ids[pattern], train[pattern], targets[pattern]
        self.horizon, self.frequency = self.targets.shape[1], self.sets.frequency[pattern]

    def content(self):
        return [("pattern", self.pattern), ("ids", tuple(self.ids)), *(("series", s) for s in self.series),
                ("test", self.targets)]

    def window_dataset(self, flag, window, with_marks=True):
        require(window.y_len - (window.x_len - window.y_offset) == self.horizon,
                f"M4 {self.pattern}'s test horizon is {self.horizon} steps; --pred_len must be it")
        return M4Windows(self.series, window, flag, HISTORY_SIZE[self.pattern],
                         None if flag == "train" else self.targets)

    def series_histories(self, flag, window, original=False):
        histories = [s[:, None] for s in self.series]
        return histories, np.arange(len(histories))

    def forecast_date(self, flag, window, i):
        return None

    def future_input(self, window, freq, embed):
        raise UserError("--do_predict forecasts past a data file's end; M4's test forecasts are written by the test "
                        "itself (m4_results/<model>/<Frequency>_forecast.csv)")


def prepare_m4(args):
    check_pattern(args.seasonal_patterns)
    return M4Data(args.root_path, args.seasonal_patterns)



def short_term_settings(args):
    """TSLib's short-term task on M4 (its Exp_Short_Term_Forecast._build_model): (pred_len, seq_len, label_len,
    frequency_map) of --seasonal_patterns, the frequency's horizon, an input of twice it, a decoder label of it and
    MASE's lag (TSLib's name, read by its M4 losses and models), whatever the script says; --loss one of its masked
    M4 losses. exp.settings.resolve_args sets them."""
    require(args.data == M4, f"--task_name short_term_forecast forecasts M4 as TSLib does: add --data m4 (with "
                             f"--root_path holding M4's files, docs/data.md#m4); --data {args.data} is forecast with "
                             "--task_name long_term_forecast")
    pattern = check_pattern(args.seasonal_patterns)
    require(args.loss in M4_LOSSES, f"--loss {args.loss} does not train on M4 here; TSLib's M4 scripts use SMAPE "
                                    f"(or MAPE): choose one of {', '.join(M4_LOSSES)}")
    require(not args.do_predict, "--do_predict forecasts past a data file's end; M4's test writes every series' "
                                 "forecast itself (<results_dir>/m4_results/<model>/<Frequency>_forecast.csv)")
    horizon = HORIZONS[pattern]
    return horizon, 2 * horizon, horizon, FREQUENCIES[pattern]


M4_LOSSES = ("SMAPE", "MAPE")


def write_synthetic_m4(folder, per_pattern=3, seed=0, layout="npz", naive2_file=False):
    """A small M4-shaped folder for tests and examples: `per_pattern` positive series a frequency (or {frequency:
    count}; seasonal sines
    on a trend, lengths from shorter than TSLib's input to several years), M4-info.csv and TSLib's training.npz /
    test.npz (layout "npz") or M4's <Frequency>-train.csv / -test.csv ("csv")."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    info, train, test = [], [], []
    for p in SEASONAL_PATTERNS:
        h, f = HORIZONS[p], FREQUENCIES[p]
        for k in range(per_pattern[p] if isinstance(per_pattern, dict) else per_pattern):
            n = int(rng.integers(max(f + 2, h), 4 * h + 3 * f * 4)) if k else max(f + 2, h // 2 + 1)
            t = np.arange(n + h)
            season = np.sin(2 * np.pi * t / max(f, 2)) * (5 + 3 * k)
            values = 100 + 10 * k + 0.3 * t * (k % 2) + season + rng.normal(scale=1.0, size=n + h)
            values = np.round(np.abs(values) + 10, 3)
            info.append((f"{p[0]}{k + 1}", p, f, h))
            train.append(values[:n])
            test.append(values[n:])
    frame = pd.DataFrame(info, columns=["M4id", "SP", "Frequency", "Horizon"])
    frame.insert(1, "category", "Other")
    frame.to_csv(os.path.join(folder, INFO_FILE), index=False)
    if layout == "npz":
        for name, rows in (("training.npz", train), ("test.npz", test)):
            with open(os.path.join(folder, name), "wb") as out:
                objects = np.empty(len(rows), dtype=object)
                objects[:] = rows
                np.save(out, objects, allow_pickle=True)
    else:
        for p in SEASONAL_PATTERNS:
            chosen = [i for i, row in enumerate(info) if row[1] == p]
            for part, rows in (("train", train), ("test", test)):
                width = max(len(rows[i]) for i in chosen)
                table = pd.DataFrame([np.pad(rows[i], (0, width - len(rows[i])), constant_values=np.nan)
                                      for i in chosen], columns=[f"V{j + 2}" for j in range(width)])
                table.insert(0, "V1", [info[i][0] for i in chosen])
                table.to_csv(os.path.join(folder, f"{p}-{part}.csv"), index=False)
    if naive2_file:  # M4's own file: Naive2 of each series, float32-exact values (TSLib reads them as float32)
        from utils.m4 import naive2

        rows = [np.float32(naive2(s, len(y), row[2])).astype(np.float64) for s, y, row in zip(train, test, info)]
        width = max(len(r) for r in rows)
        table = pd.DataFrame([np.pad(r, (0, width - len(r)), constant_values=np.nan) for r in rows],
                             columns=[f"V{j + 1}" for j in range(width)])
        table.insert(0, "id", [row[0] for row in info])
        table.to_csv(os.path.join(folder, "submission-Naive2.csv"), index=False, float_format="%.9g")
    return folder
