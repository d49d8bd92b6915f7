"""The three splits and where they end: the ETT benchmark's fixed borders, otherwise 70/10/20 %."""
from utils.errors import require

SPLITS = ("train", "val", "test")

# Fixed borders of the ETT benchmark (12/4/4 months); minute data has 4 rows per hour.
_ETT_MONTH_HOURS = 30 * 24
_ETT_ROWS_PER_HOUR = {"ETTh1": 1, "ETTh2": 1, "ETTm1": 4, "ETTm2": 4}
ETT_DATASETS = tuple(_ETT_ROWS_PER_HOUR)


def split_ends(data, total_rows):
    """Row where each of train, val, test ends."""
    if data in _ETT_ROWS_PER_HOUR:
        unit = _ETT_MONTH_HOURS * _ETT_ROWS_PER_HOUR[data]
        ends = [12 * unit, 16 * unit, 20 * unit]
        require(total_rows >= ends[-1], f"{data} needs at least {ends[-1]} rows, the file has {total_rows}; use --data custom for other files")
        return ends
    n_train = int(total_rows * 0.7)
    n_test = int(total_rows * 0.2)
    return [n_train, total_rows - n_test, total_rows]


def split_start(ends, split, history):
    """First row of `split`. Val and test start `history` rows before their border so their
    first window has a full input (the benchmark convention)."""
    i = SPLITS.index(split)
    return 0 if i == 0 else max(ends[i - 1] - history, 0)
