"""fev's task definitions and data, read without fev (autogluon/fev 0.10.0, fev.Task and fev.utils, written here
from their documented behaviour):

- a task is fev.Task's fields (TASK_FIELDS, their defaults); a benchmark file is YAML with a `tasks:` list, as
  fev.Benchmark.from_yaml reads it (fev-bench's tasks.yaml);
- its data is one row per series (the id, a list of timestamps, a list per target and dynamic covariate, a
  scalar per static covariate), read from `<data_root>/<dataset_config>/*.parquet` (fev's
  FEV_DATASETS_PREFIX mirror layout) or from the task's dataset_path, a local .parquet / .arrow file;
  `generate_univariate_targets_from` makes each listed column its own series, id `<id>_<column>`;
- the windows: cutoffs initial_cutoff + k * window_step_size (initial_cutoff defaults to
  -horizon - (num_windows - 1) * window_step_size; a timestamp cutoff counts the steps at or before it); a
  series takes part in a window where it has at least min_context_length steps before the cutoff and horizon
  steps after it; its past is the last max_context_length steps before the cutoff (all of them by default).
"""
import hashlib
import math
import re
from pathlib import Path

import numpy as np

from utils.errors import UserError, require

# fev.Task's fields and defaults, in to_dict's order: the task columns of every summary row
TASK_FIELDS = {
    "dataset_path": None, "dataset_config": None, "horizon": 1, "num_windows": 1, "initial_cutoff": None,
    "window_step_size": None, "min_context_length": 1, "max_context_length": None, "seasonality": 1,
    "eval_metric": "MASE", "extra_metrics": [], "quantile_levels": [], "id_column": "id",
    "timestamp_column": "timestamp", "target": "target", "generate_univariate_targets_from": None,
    "known_dynamic_columns": [], "past_dynamic_columns": [], "static_columns": [], "task_name": None,
}
# the names fev reads older task files with
DEPRECATED = {"num_rolling_windows": "num_windows", "rolling_step_size": "window_step_size", "cutoff": "initial_cutoff",
              "target_column": "target", "multiple_target_columns": "generate_univariate_targets_from"}
METRICS = ("SQL", "MASE", "WAPE", "WQL")  # the metrics this harness scores (fev's definitions)


def task(definition, where="a task"):
    """A task's fields as fev.Task normalises them (sorted columns and levels, the defaults filled in)."""
    require(isinstance(definition, dict), f"{where} is not a mapping of fev.Task's fields")
    d = {DEPRECATED.get(k, k): v for k, v in definition.items() if k != "lead_time"}
    unknown = sorted(set(d) - set(TASK_FIELDS))
    require(not unknown, f"{where}: {', '.join(unknown)} is not a field of fev.Task ({', '.join(TASK_FIELDS)})")
    require(d.get("dataset_path"), f"{where} names no dataset_path")
    t = {**{k: (list(v) if isinstance(v, list) else v) for k, v in TASK_FIELDS.items()}, **d}
    name = t["task_name"] or t["dataset_config"] or "/".join(Path(t["dataset_path"]).parts[-3:-1])
    t["task_name"] = name
    for field in ("horizon", "num_windows", "min_context_length", "seasonality"):
        require(isinstance(t[field], int) and t[field] >= 1, f"{name}: {field} must be a whole number >= 1, "
                f"got {t[field]!r}")
    if t["window_step_size"] is None:
        t["window_step_size"] = t["horizon"]
    step = t["window_step_size"]
    if isinstance(step, str):  # a pandas offset ('D', '15min'), with a timestamp initial_cutoff only
        import pandas as pd

        try:
            offset = pd.tseries.frequencies.to_offset(step)
        except ValueError:
            raise UserError(f"{name}: window_step_size {step!r} is neither a number of steps nor a pandas offset") \
                from None
        require(offset.n >= 1, f"{name}: window_step_size {step!r} must be a positive offset")
        t["window_step_size"] = offset.freqstr
        require(t["initial_cutoff"] is not None and not isinstance(t["initial_cutoff"], int), f"{name}: a "
                f"window_step_size in time ({step!r}) needs a timestamp initial_cutoff")
    else:
        require(isinstance(step, int) and step >= 1,
                f"{name}: window_step_size must be a whole number of steps >= 1 or a pandas offset, got {step!r}")
    if t["initial_cutoff"] is None:
        t["initial_cutoff"] = -t["horizon"] - (t["num_windows"] - 1) * t["window_step_size"]
    if isinstance(t["initial_cutoff"], int):
        last = -t["horizon"] - (t["num_windows"] - 1) * t["window_step_size"]
        require(t["initial_cutoff"] >= 0 or t["initial_cutoff"] <= last, f"{name}: a negative initial_cutoff must "
                f"be <= -horizon - (num_windows - 1) * window_step_size = {last}")
    else:
        import pandas as pd

        try:
            t["initial_cutoff"] = pd.Timestamp(t["initial_cutoff"]).isoformat()
        except (ValueError, TypeError):
            raise UserError(f"{name}: initial_cutoff {t['initial_cutoff']!r} is neither a step nor a timestamp") \
                from None
    levels = t["quantile_levels"]
    require(isinstance(levels, list) and all(isinstance(q, (int, float)) and 0 < q < 1 for q in levels),
            f"{name}: quantile_levels must be a list of levels in (0, 1)")
    t["quantile_levels"] = sorted(levels)
    metrics = [t["eval_metric"], *t["extra_metrics"]]
    names = [m["name"] if isinstance(m, dict) else m for m in metrics]
    other = [m for m in names if m not in METRICS]
    require(not other, f"{name}: metric {', '.join(map(str, other))} is not scored here; use {', '.join(METRICS)}")
    if isinstance(t["target"], list):
        require(t["target"], f"{name}: target is an empty list")
        t["target"] = sorted(t["target"])
    for field in ("known_dynamic_columns", "past_dynamic_columns", "static_columns"):
        t[field] = sorted(t[field])
    return t


def read_benchmark(path):
    """[task] from a YAML file with a `tasks:` list (fev.Benchmark.from_yaml's layout)."""
    import yaml

    path = Path(path)
    require(path.is_file(), f"--tasks {path}: no such file (a YAML file with a `tasks:` list, as fev-bench's)")
    try:
        loaded = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"--tasks {path} is not YAML ({str(exc).splitlines()[0]})") from None
    require(isinstance(loaded, dict) and isinstance(loaded.get("tasks"), list) and loaded["tasks"],
            f"--tasks {path} has no `tasks:` list of task definitions")
    return [task(d, f"--tasks {path}: task {i + 1}") for i, d in enumerate(loaded["tasks"])]


def data_files(t, data_root):
    """The files a task's data is read from, in a fixed order."""
    if t["dataset_config"] is not None:
        folder = Path(data_root or ".") / t["dataset_config"]
        files = sorted(folder.glob("*.parquet"))
        require(files, f"{t['task_name']}: no {folder}/*.parquet (its data, in fev's mirror layout "
                "<data_root>/<dataset_config>/*.parquet)")
        return files
    path = Path(t["dataset_path"])
    if not path.is_absolute() and data_root is not None:
        path = Path(data_root) / path
    require(path.suffix in (".parquet", ".arrow"), f"{t['task_name']}: dataset_path {t['dataset_path']} is not a "
            "local .parquet or .arrow file (no dataset host is read here)")
    require(path.is_file(), f"{t['task_name']}: no file {path}")
    return [path]


def digest(files):
    """The sha256 of the task's data: each file's name and bytes, in order (a stored result names it)."""
    h = hashlib.sha256()
    for path in files:
        h.update(b"\0" + Path(path).name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _table(files, name):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import ipc

    try:
        tables = []
        for path in files:
            if str(path).endswith(".arrow"):
                with pa.memory_map(str(path)) as source:
                    try:
                        tables.append(ipc.open_stream(source).read_all())
                    except pa.ArrowInvalid:
                        tables.append(ipc.open_file(source).read_all())
            else:
                tables.append(pq.read_table(path))
        return pa.concat_tables(tables)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{name}: its data cannot be read ({str(exc).splitlines()[0]})") from None


def load(t, files):
    """{"ids": [str], "timestamps": [datetime64 [T]], "targets": [float64 [D, T]], "known"/"past": [K arrays [T]:
    float64, or object (str) for a categorical column],
    "static": [[a float, or a str for a categorical column, per static column]], "target_columns": [str]}, one
    entry per series, sorted by id as fev sorts them."""
    name = t["task_name"]
    table = _table(files, name)
    columns = set(table.column_names)
    id_col, ts_col = t["id_column"], t["timestamp_column"]
    require(id_col in columns and ts_col in columns, f"{name}: its data has no column {id_col!r} or {ts_col!r} "
            "(fev's layout: one row per series, the timestamps and each dynamic column a list)")
    import pyarrow as pa

    require(pa.types.is_list(table.schema.field(ts_col).type) or pa.types.is_large_list(table.schema.field(ts_col).type),
            f"{name}: {ts_col!r} is not a list per row (the long layout, a row per step, is not read here: "
            "convert it to one row per series)")
    generate = t["generate_univariate_targets_from"]
    if generate == "__ALL__":
        generate = [c for c in table.column_names if c not in (id_col, ts_col)
                    and pa.types.is_list(table.schema.field(c).type)]
    targets = [t["target"]] if generate is None else list(generate)
    if isinstance(t["target"], list):
        targets = t["target"]
    needed = [*targets, *t["known_dynamic_columns"], *t["past_dynamic_columns"], *t["static_columns"]]
    missing = [c for c in needed if c not in columns]
    require(not missing, f"{name}: its data has no column {', '.join(missing)}")
    covariate_columns = [*t["known_dynamic_columns"], *t["past_dynamic_columns"]]
    not_lists = [c for c in covariate_columns if not (pa.types.is_list(table.schema.field(c).type)
                                                       or pa.types.is_large_list(table.schema.field(c).type))]
    require(not not_lists, f"{name}: dynamic column {', '.join(not_lists)} is not a list per row (fev's layout)")
    numeric = {c: _numeric(table.schema.field(c).type.value_type) for c in covariate_columns}
    rows = table.to_pydict()
    series = []
    for i, sid in enumerate(rows[id_col]):
        stamps = np.asarray(rows[ts_col][i], dtype="datetime64[ns]")

        def dynamic(cols):
            try:
                values = [np.asarray(rows[c][i], dtype=np.float64) for c in cols]
            except (TypeError, ValueError):
                raise UserError(f"{name}: a target column of {', '.join(cols)} is not numbers (series {sid})") \
                    from None
            return np.array(values).reshape(len(cols), len(stamps))

        def covariates(cols):
            """Each column over the series' steps: float64 for a column of numbers, else an object array of str
            (None where missing), a categorical covariate (the column's data type decides, for every series)."""
            out = []
            for c in cols:
                values = rows[c][i] or []
                require(len(values) == len(stamps), f"{name}: covariate {c!r} of series {sid} has {len(values)} "
                        f"values for its {len(stamps)} timestamps")
                out.append(np.asarray(values, dtype=np.float64) if numeric[c] else
                           np.array([None if v is None else str(v) for v in values], dtype=object))
            return out

        static = [rows[c][i] for c in t["static_columns"]]
        known, past = covariates(t["known_dynamic_columns"]), covariates(t["past_dynamic_columns"])
        if generate is None:
            series.append((str(sid), stamps, dynamic(targets), known, past, static))
        else:  # each column its own univariate series
            series.extend((f"{sid}_{c}", stamps, dynamic([c]), known, past, static) for c in targets)
    series.sort(key=lambda s: s[0])
    lengths = {len(s[1]) for s in series}
    require(series, f"{name}: its data holds no series")
    statics = _static_values([s[5] for s in series], len(t["static_columns"]))
    require(all(s[2].shape[1] == len(s[1]) for s in series), f"{name}: a target's length differs from its timestamps'")
    return {"freq": _frequency(series[0][1]), "ids": [s[0] for s in series], "timestamps": [s[1] for s in series], "targets": [s[2] for s in series],
            "known": [s[3] for s in series], "past": [s[4] for s in series], "static": statics,
            "target_columns": [t["target"]] if generate is not None else targets, "lengths": lengths}


def _numeric(value_type):
    """Whether a column's values are numbers (else categories)."""
    import pyarrow as pa

    return pa.types.is_integer(value_type) or pa.types.is_floating(value_type) or pa.types.is_decimal(value_type)


def _static_values(rows, n_columns):
    """Each static column's values as one kind for every series: numbers (float, None as NaN) where all its values
    are numbers, else categories (str, None kept as missing)."""
    columns = [[row[c] for row in rows] for c in range(n_columns)]
    kinds = [all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in col)
             for col in columns]
    return [[(math.nan if v is None else float(v)) if numeric else (None if v is None else str(v))
             for v, numeric in zip(row, kinds)] for row in rows]


def cutoffs(t, freq=None):
    """Each window's cutoff: a step index (negative from the end), or an ISO timestamp, the k-th the first plus k
    window steps (an offset, or a number of steps of the data's frequency `freq`), as fev.Task.cutoffs."""
    if isinstance(t["initial_cutoff"], int):
        return [t["initial_cutoff"] + k * t["window_step_size"] for k in range(t["num_windows"])]
    import pandas as pd

    step = t["window_step_size"]
    offset = (pd.tseries.frequencies.to_offset(step) if isinstance(step, str) else
              pd.tseries.frequencies.to_offset(freq) * step if freq else None)
    require(offset is not None or t["num_windows"] == 1, f"{t['task_name']}: its data's frequency cannot be "
            "inferred, so window_step_size steps are no time; give window_step_size as an offset ('D', '15min')")
    first = pd.Timestamp(t["initial_cutoff"])
    # the first window's cutoff is not shifted (an anchored offset would move it: fev's rule)
    return [(first if k == 0 else first + k * offset).isoformat() for k in range(t["num_windows"])]


def windows(t, data):
    """[(series, window, cutoff index)] of every series in every window it takes part in (fev's filter)."""
    out = []
    for k, cut in enumerate(cutoffs(t, data["freq"])):
        for s, stamps in enumerate(data["timestamps"]):
            n = len(stamps)
            if isinstance(cut, str):  # the steps at or before the timestamp
                index = int(np.searchsorted(stamps, np.datetime64(cut, "ns"), side="right"))
            else:
                index = min(max(cut if cut >= 0 else n + cut, 0), n)
            if index >= t["min_context_length"] and n - index >= t["horizon"]:
                out.append((s, k, index))
    require(out, f"{t['task_name']}: every series is too short for its windows (horizon {t['horizon']}, "
            f"{t['num_windows']} window(s), min_context_length {t['min_context_length']})")
    return out


def safe_name(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "__", name)


def own_task(entry, horizon, num_windows, seasonality):
    """`NAME=PATH` (--dataset): a task over the user's file, named NAME, fev-bench's metrics and levels."""
    name, sep, path = entry.partition("=")
    require(sep and name.strip() and path.strip(), f"--dataset {entry!r}: give NAME=PATH, PATH a .parquet or .arrow "
            "file in fev's layout (one row per series: id, timestamp list, target list)")
    require(horizon is not None, f"--dataset {name}: give its --horizon (steps to forecast)")
    return task({"dataset_path": str(Path(path).resolve()), "task_name": name.strip(), "horizon": horizon,
                 "num_windows": num_windows, "seasonality": seasonality, "eval_metric": "SQL",
                 "extra_metrics": ["MASE", "WAPE", "WQL"], "quantile_levels": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7,
                                                                               0.8, 0.9]}, f"--dataset {name}")


def _frequency(stamps):
    """pandas' frequency string of a series' timestamps (fev infers it from the first series), or None."""
    import warnings

    import pandas as pd

    if len(stamps) < 3:
        return None
    with warnings.catch_warnings():  # pandas' notice that infer_freq will return an offset
        warnings.simplefilter("ignore")
        freq = pd.infer_freq(pd.DatetimeIndex(stamps))
    return getattr(freq, "freqstr", freq)


def season_of(stamps):
    """The season utils.metrics.seasonality gives the series' frequency (1 if it cannot be inferred)."""
    import warnings

    import pandas as pd

    from utils.metrics import seasonality

    with warnings.catch_warnings():  # pandas' notice that infer_freq will return an offset
        warnings.simplefilter("ignore")
        freq = pd.infer_freq(pd.DatetimeIndex(stamps[:min(len(stamps), 200)])) if len(stamps) >= 3 else None
    freq = getattr(freq, "freqstr", freq)
    try:
        return seasonality(freq) if freq else 1
    except (UserError, ValueError):
        return 1


def finite_or_none(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x
