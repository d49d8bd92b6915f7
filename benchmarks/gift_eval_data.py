"""GIFT-Eval's data and rules (Aksu et al., "GIFT-Eval: A Benchmark for General Time Series Forecasting Model
Evaluation", 2024; github.com/SalesforceAIResearch/gift-eval at 4fd98a9), written here from its facts:

- src/gift_eval/data.py: the prediction length of a frequency (PRED_LENGTH_MAP, M4_PRED_LENGTH_MAP for the m4_*
  data sets) times the term's multiplier (short 1, medium 10, long 15); the number of rolling test windows
  min(max(1, ceil(0.1 * shortest series / prediction length)), 20), 1 for m4_*; the test windows are the last
  `windows` blocks of `prediction_length` steps of each series, each forecast from all the steps before it;
  a multivariate data set is scored as univariate series (MultivariateToUnivariate: item `<id>_dim<i>`);
  the shortest series of a multivariate set is its first variate's.
- notebooks/naive.ipynb: the 55 short-term data sets and the 21 medium/long ones (97 configurations),
  the CSV's `dataset` names (`<key>/<freq>/<term>`, key lower-cased and shortened by `pretty_names`),
  notebooks/dataset_properties.json: each data set's domain, frequency and number of variates.

The data is read as Hugging Face `datasets` saves it (save_to_disk): a folder per data set (and frequency)
with state.json naming Arrow stream files of the columns item_id, start, freq, target (a list of floats, or
of lists for a multivariate set). pyarrow reads them (the optional extra `[gift]`).
"""
import json
import math
import re
from pathlib import Path

import numpy as np

from utils.errors import UserError, require

TEST_SPLIT = 0.1
MAX_WINDOWS = 20
TERMS = {"short": 1, "medium": 10, "long": 15}
PRED_LENGTH = {"M": 12, "W": 8, "D": 30, "H": 48, "T": 48, "S": 60}
M4_PRED_LENGTH = {"A": 6, "Q": 8, "M": 18, "W": 13, "D": 14, "H": 48}

SHORT = ("m4_yearly m4_quarterly m4_monthly m4_weekly m4_daily m4_hourly electricity/15T electricity/H "
         "electricity/D electricity/W solar/10T solar/H solar/D solar/W hospital covid_deaths us_births/D "
         "us_births/M us_births/W saugeenday/D saugeenday/M saugeenday/W temperature_rain_with_missing "
         "kdd_cup_2018_with_missing/H kdd_cup_2018_with_missing/D car_parts_with_missing restaurant "
         "hierarchical_sales/D hierarchical_sales/W LOOP_SEATTLE/5T LOOP_SEATTLE/H LOOP_SEATTLE/D SZ_TAXI/15T "
         "SZ_TAXI/H M_DENSE/H M_DENSE/D ett1/15T ett1/H ett1/D ett1/W ett2/15T ett2/H ett2/D ett2/W "
         "jena_weather/10T jena_weather/H jena_weather/D bitbrains_fast_storage/5T bitbrains_fast_storage/H "
         "bitbrains_rnd/5T bitbrains_rnd/H bizitobs_application bizitobs_service bizitobs_l2c/5T "
         "bizitobs_l2c/H").split()
MED_LONG = ("electricity/15T electricity/H solar/10T solar/H kdd_cup_2018_with_missing/H LOOP_SEATTLE/5T "
            "LOOP_SEATTLE/H SZ_TAXI/15T M_DENSE/H ett1/15T ett1/H ett2/15T ett2/H jena_weather/10T jena_weather/H "
            "bitbrains_fast_storage/5T bitbrains_rnd/5T bizitobs_application bizitobs_service bizitobs_l2c/5T "
            "bizitobs_l2c/H").split()
PRETTY = {"saugeenday": "saugeen", "temperature_rain_with_missing": "temperature_rain",
          "kdd_cup_2018_with_missing": "kdd_cup_2018", "car_parts_with_missing": "car_parts"}
# dataset_properties.json: key -> (domain, frequency written in the CSV name when the folder has none, variates)
PROPERTIES = {
    "m4_yearly": ("Econ/Fin", "A", 1), "m4_quarterly": ("Econ/Fin", "Q", 1), "m4_monthly": ("Econ/Fin", "M", 1),
    "m4_weekly": ("Econ/Fin", "W", 1), "m4_daily": ("Econ/Fin", "D", 1), "m4_hourly": ("Econ/Fin", "H", 1),
    "electricity": ("Energy", "W", 1), "ett1": ("Energy", "W", 7), "ett2": ("Energy", "W", 7),
    "solar": ("Energy", "W", 1), "hospital": ("Healthcare", "M", 1), "covid_deaths": ("Healthcare", "D", 1),
    "us_births": ("Healthcare", "M", 1), "saugeen": ("Nature", "M", 1), "temperature_rain": ("Nature", "D", 1),
    "kdd_cup_2018": ("Nature", "D", 1), "jena_weather": ("Nature", "D", 21), "car_parts": ("Sales", "M", 1),
    "restaurant": ("Sales", "D", 1), "hierarchical_sales": ("Sales", "W-WED", 1),
    "loop_seattle": ("Transport", "D", 1), "sz_taxi": ("Transport", "H", 1), "m_dense": ("Transport", "D", 1),
    "bitbrains_fast_storage": ("Web/CloudOps", "H", 2), "bitbrains_rnd": ("Web/CloudOps", "H", 2),
    "bizitobs_application": ("Web/CloudOps", "10S", 2), "bizitobs_service": ("Web/CloudOps", "10S", 2),
    "bizitobs_l2c": ("Web/CloudOps", "H", 7),
}
# a frequency's unit as pandas (old and new spellings) writes it -> GIFT-Eval's letter (maybe_reconvert_freq)
_UNIT = {"A": "A", "Y": "A", "YE": "A", "AS": "A", "YS": "A", "Q": "Q", "QE": "Q", "QS": "Q", "M": "M", "ME": "M",
         "MS": "M", "W": "W", "D": "D", "H": "H", "h": "H", "T": "T", "min": "T", "S": "S", "s": "S"}


def configurations(datasets=None, terms=("short", "medium", "long")):
    """[(data set name, term)] in a fixed order: GIFT-Eval's short list, each data set's terms in order;
    medium and long only for the 21 data sets that have them (97 in all)."""
    chosen = SHORT if datasets is None else list(datasets)
    unknown = [d for d in chosen if d not in SHORT]
    require(not unknown, f"--datasets: {', '.join(unknown)} is not one of GIFT-Eval's 55 data sets "
            f"(names as its notebooks write them, e.g. electricity/15T, hospital, m4_weekly)")
    return [(name, term) for name in SHORT if name in chosen for term in terms
            if term == "short" or name in MED_LONG]


def key_of(name):
    """The data set's key in dataset_properties.json and the CSV: lower-cased, shortened."""
    key = name.split("/")[0].lower()
    return PRETTY.get(key, key)


def csv_name(name, term):
    """GIFT-Eval's `dataset` column: `<key>/<freq>/<term>`, the freq the folder's or the properties'."""
    freq = name.split("/")[1] if "/" in name else PROPERTIES[key_of(name)][1]
    return f"{key_of(name)}/{freq}/{term}"


def base_unit(freq, m4=False):
    """GIFT-Eval's letter for a pandas frequency string ('15T', '10S', 'W-WED', 'h', 'ME'): norm_freq_str then
    maybe_reconvert_freq; a frequency it defines no prediction length for is refused."""
    match = re.fullmatch(r"(\d*)([A-Za-z]+)(-\w+)?", str(freq).strip())
    unit = _UNIT.get(match.group(2)) if match else None
    lengths = M4_PRED_LENGTH if m4 else PRED_LENGTH
    require(unit in lengths, f"frequency '{freq}' is not one GIFT-Eval defines a prediction length for "
            f"({'m4 data sets: ' if m4 else ''}{', '.join(lengths)} and their multiples)")
    return unit


def prediction_length(name, freq, term):
    m4 = "m4" in name
    return TERMS[term] * (M4_PRED_LENGTH if m4 else PRED_LENGTH)[base_unit(freq, m4)]


def windows(name, shortest, horizon):
    """The number of rolling test windows: 1 for m4, else ceil(10 % of the shortest series / horizon) in [1, 20]."""
    if "m4" in name:
        return 1
    return min(max(1, math.ceil(TEST_SPLIT * shortest / horizon)), MAX_WINDOWS)


def read_dataset(folder):
    """A data set as save_to_disk wrote it: {"freq", "item_id": [str], "target": [float32 [T] or [C, T]]}."""
    import pyarrow as pa
    from pyarrow import ipc

    folder = Path(folder)
    state = folder / "state.json"
    require(folder.is_dir() and state.is_file(), f"{folder} is not a GIFT-Eval data set: no state.json (a folder "
            "as Hugging Face datasets' save_to_disk writes it, from huggingface.co/datasets/Salesforce/GiftEval)")
    try:
        files = [folder / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        tables = []
        for path in files:
            with pa.memory_map(str(path)) as source:
                tables.append(ipc.open_stream(source).read_all())
        table = pa.concat_tables(tables)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise UserError(f"{folder} is not a GIFT-Eval data set: its Arrow files cannot be read ({exc})") from None
    missing = {"item_id", "freq", "target"} - set(table.column_names)
    require(not missing and table.num_rows > 0, f"{folder} is not a GIFT-Eval data set: "
            + (f"no column {', '.join(sorted(missing))}" if missing else "no series"))
    # numpy reads a null (a gap Arrow stores as null rather than NaN) as NaN in a float array
    targets = [np.asarray(t, dtype=np.float32) for t in table.column("target").to_pylist()]
    return {"freq": str(table.column("freq")[0]), "item_id": [str(i) for i in table.column("item_id").to_pylist()],
            "target": targets}


def content_digest(folder):
    """The sha256 of what read_dataset reads: state.json, then each Arrow file it names, name and bytes. A
    stored result names the data it was computed on by it (a file replaced, edited or added changes it)."""
    import hashlib

    folder = Path(folder)
    digest = hashlib.sha256()
    state = (folder / "state.json").read_bytes()
    digest.update(state)
    for entry in json.loads(state)["_data_files"]:
        digest.update(b"\0" + entry["filename"].encode() + b"\0")
        with open(folder / entry["filename"], "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def write_dataset(folder, freq, targets, start="2020-01-01"):
    """Write series as save_to_disk does (tests' synthetic sets): targets [T] or [C, T] arrays (NaN gaps kept)."""
    import pyarrow as pa
    from pyarrow import ipc

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    multivariate = np.asarray(targets[0]).ndim == 2
    values = pa.list_(pa.list_(pa.float32())) if multivariate else pa.list_(pa.float32())
    table = pa.table({
        "item_id": pa.array([f"item_{i}" for i in range(len(targets))]),
        "start": pa.array([np.datetime64(start, "s")] * len(targets), pa.timestamp("s")),
        "freq": pa.array([freq] * len(targets)),
        "target": pa.array([np.asarray(t, np.float32).tolist() for t in targets], values, from_pandas=True),
    })
    with ipc.new_stream(str(folder / "data-00000-of-00001.arrow"), table.schema) as writer:
        writer.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (folder / "dataset_info.json").write_text("{}")


def univariate_series(data):
    """Each variate of a multivariate set as its own series (to_univariate), in item order, then variate order."""
    series = []
    for target in data["target"]:
        series.extend([target] if target.ndim == 1 else list(target))
    return series


def shortest(data):
    """The shortest series' length, a multivariate set's first variates' (GIFT-Eval's _min_series_length)."""
    return min(t.shape[-1] for t in data["target"])


def instances(series, horizon, n_windows):
    """[(series index, window, start)]: GIFT-Eval's test windows, each scoring target[start:start+horizon]
    forecast from target[:start], the last window ending at the series' end (gluonts' split + generate_instances)."""
    out = []
    for s, target in enumerate(series):
        first = len(target) - horizon * n_windows
        require(first >= 1, f"a series of {len(target)} steps has no history before its {n_windows} test "
                f"window(s) of {horizon} steps")
        out.extend((s, w, first + w * horizon) for w in range(n_windows))
    return out
