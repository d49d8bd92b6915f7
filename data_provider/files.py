"""Reading a data file (CSV, raw text, gzipped text, .npy) or the built-in synthetic data into a Table."""
import contextlib
import csv
import functools
import gzip
import itertools
import logging
import os
import re
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from data_provider.synthetic import make_synthetic
from utils import distributed
from utils.errors import UserError, require

logger = logging.getLogger("tsl")


@dataclass
class Table:
    """A data file as read: numeric values, column names, timestamps (or None)."""

    values: np.ndarray  # [T, C] float64
    columns: list
    dates: pd.Series = None


def _read_raw_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        first = f.readline()
    sep = "," if "," in first else r"\s+"
    return pd.read_csv(path, header=None, sep=sep)


def _is_number(text, decimal="."):
    try:
        float(text.replace(decimal, "."))
        return True
    except ValueError:
        return False


SEPARATORS = ";\t|,"  # in order of preference where two split every line alike: a ',' in a ';' file is a decimal mark
SNIFFED_LINES = 20  # csv.Sniffer takes ~2 ms a 1000-column line
# the header pandas gives a column whose header cell is empty, as df.to_csv(path) writes the index's
UNNAMED = re.compile(r"Unnamed: \d+(\.\d+)?")


def _separator(path):
    """The column separator of a CSV, as csv.Sniffer finds it in the first lines (',' for one column)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        sample = "".join(itertools.islice(f, SNIFFED_LINES))
    sniffer = csv.Sniffer()
    sniffer.preferred = list(SEPARATORS)
    try:
        return sniffer.sniff(sample, delimiters=SEPARATORS).delimiter
    except csv.Error:  # no character splits every line alike: one column
        return ","


def _text_columns(frame):
    return [c for c in frame.columns if c != "date" and not pd.api.types.is_numeric_dtype(frame[c])]


def _has_decimal_commas(frame):
    """Whether a column pandas left as text holds commas: decimal commas, in a file not separated by ','."""
    return any(frame[c].astype(str).str.contains(",", regex=False).any() for c in _text_columns(frame))


def _refuse_mixed_decimal_marks(frame, path):
    """Read with decimal commas, a cell that is a number with a decimal point is ambiguous (which mark is the
    decimal and which a thousands separator?): refused rather than guessed."""
    for col in _text_columns(frame):
        dotted = pd.to_numeric(frame[col], errors="coerce").notna()
        if dotted.any():
            raise UserError(f"{path}: column '{col}' holds {frame[col][dotted].iloc[0]!r} (row {dotted.idxmax() + 1}) "
                            "with a decimal point, where the file's other numbers have decimal commas; write every "
                            "number with the same decimal mark and no thousands separators")


def _read_fields(path, sep, **options):
    """pd.read_csv, refusing rows longer than the header (pandas would make their leading fields the index:
    the decimal commas of a file separated by ',' shift every value)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)  # index_col=False: rows longer than the header
        try:
            return pd.read_csv(path, sep=sep, index_col=False, **options)
        except pd.errors.ParserWarning:
            raise UserError(f"{path}: its rows have more fields than its header (fields separated by {sep!r}); "
                            "decimal commas in a file separated by ','? Write it with decimal points, or "
                            "separated by ';'") from None


def _read_csv(path):
    """A CSV as a frame: separated by ',', ';', tab or '|' (sniffed), with decimal points, or decimal commas
    when not separated by ',' (as European spreadsheets export it), with or without a header row."""
    sep = _separator(path)
    frame, decimal = _read_fields(path, sep), "."
    if sep != "," and _has_decimal_commas(frame):
        frame, decimal = _read_fields(path, sep, decimal=","), ","
        _refuse_mixed_decimal_marks(frame, path)
    if all(_is_number(str(c), decimal) for c in frame.columns) and not _is_pandas_header(frame, path, sep):
        frame = _read_fields(path, sep, decimal=decimal, header=None)  # a CSV without a header row
    frame.columns = [str(c) for c in frame.columns]
    return _drop_written_index(frame, path)


def _is_pandas_header(frame, path, sep):
    """Whether a first line of numbers is a header: the names 0, 1, ..., n-1 that pandas gives the columns of a
    frame made from an array, and writes (pd.DataFrame(array).to_csv(path, index=False)). Any other numbers are a
    row of a file without a header (np.savetxt's, to_csv(header=False)'s). Where every value below is an integer,
    the line 0, 1, ... could be a row of the data as well: refused, not guessed."""
    names = [str(c).strip() for c in frame.columns]
    if names != [str(i) for i in range(len(names))]:
        return False
    integers = len(frame) > 0 and all(pd.api.types.is_integer_dtype(frame[c]) for c in frame.columns)
    require(not integers,
            f"{path}: its first line {sep.join(names)!r} may be a header (the column names pandas writes for a frame "
            "made from an array) or a row of data (every value below it is an integer); give the columns names "
            "that are not numbers in a header row (e.g. df.columns = [f'x{i}' for i in df.columns] before "
            "df.to_csv(path, index=False)), or save the array as .npy")
    return True


def _drop_written_index(frame, path):
    """A column without a name that counts the rows one by one is the index df.to_csv(path) writes by default:
    dropped, with a warning (as a channel it would be trained on). Any other column without a name is refused."""
    if frame.empty:
        return frame  # _frame_to_table refuses a file without rows
    for col in [c for c in frame.columns if UNNAMED.fullmatch(c)]:
        values = frame[col].to_numpy()
        require(pd.api.types.is_integer_dtype(values) and (np.diff(values) == 1).all(),
                f"{path}: column {frame.columns.get_loc(col) + 1} has no name in the header (pandas calls it '{col}') "
                "and is not a row index; name it in the header ('date' if it holds the timestamps), or remove it")
        frame = frame.drop(columns=[col])
        if distributed.env_rank() == 0:  # every rank reads the file: warn once
            logger.warning(f"{path}: dropped column '{col}', a row index without a name (as df.to_csv(path) writes "
                           "it); write the file with df.to_csv(path, index=False) to leave it out")
    return frame


def _frame_to_table(frame, path, date_format=None, dates_used=True):
    require(len(frame) > 0, f"{path} has a header but no data rows; check the file")
    dates = None
    if "date" in frame.columns:
        dates = _parse_dates(frame["date"], path, date_format, order_matters=dates_used)
        frame = frame.drop(columns=["date"])
    require(frame.shape[1] > 0, f"{path} has no numeric columns, only 'date'; check the file")
    for col in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[col]):
            bad = frame[col][pd.to_numeric(frame[col], errors="coerce").isna() & frame[col].notna()]
            raise UserError(
                f"{path}: column '{col}' is not numeric (e.g. {bad.iloc[0]!r} in row {bad.index[0] + 1}); "
                "clean the file or drop the column"
            )
    values = frame.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        counts = bad.sum(axis=0)
        cols = ", ".join(f"'{c}' ({n})" for c, n in zip(frame.columns, counts) if n)
        raise UserError(f"{path}: NaN or infinite values in column(s) {cols}; fill or drop them before training")
    return Table(values=values, columns=[str(c) for c in frame.columns], dates=dates)


def _first_unparsable(column):
    """The first value pandas cannot read, and its row (pandas explains over several lines without
    the row), or None when no single value is to blame (mixed time zones fail even when coerced)."""
    try:
        failed = pd.to_datetime(column, errors="coerce").isna() & column.notna()
    except (ValueError, TypeError, OverflowError):
        return None
    return f"{column[failed].iloc[0]!r} in row {failed.idxmax() + 1}" if failed.any() else None


def _refuse_changing_offsets(column, path):
    """Timestamps whose UTC offset changes (daylight saving time): pandas reads them only when told to convert
    them to UTC (utc=True), which no run.py argument does; refused, saying how to write the file."""
    try:
        pd.to_datetime(column, utc=True)
    except (ValueError, TypeError, OverflowError):
        return  # not (only) the offsets: the caller names the value
    first = pd.Timestamp(column.iloc[0]).utcoffset()
    row = next((i for i, text in enumerate(column) if pd.Timestamp(text).utcoffset() != first), None)  # the change
    if row is None:
        return
    raise UserError(f"{path}: the 'date' column's UTC offset changes ({column.iloc[0]!r} in row 1, "
                    f"{column.iloc[row]!r} in row {row + 1}; daylight saving time?), and run.py reads one offset "
                    "per file: write the column in UTC (in pandas: df['date'] = pd.to_datetime(df['date'], "
                    "utc=True)), or remove it")


def _first_text(column):
    """The first date as written, or None for a column that pandas did not read as text."""
    if not (pd.api.types.is_object_dtype(column) or pd.api.types.is_string_dtype(column)):
        return None
    return next((text for text in column if isinstance(text, str) and text.strip()), None)


def _swapped(date_format):
    """The format with its day (%d) and month (%m) swapped, or None if it lacks either."""
    if "%d" not in date_format or "%m" not in date_format:
        return None
    return date_format.replace("%d", "\0").replace("%m", "%d").replace("\0", "%m")


def _day_first(date_format):
    return date_format.index("%d") < date_format.index("%m")


def _first_failure(column, date_format):
    """The row (0-based) of the first value `date_format` does not read, None if it reads every value."""
    try:
        failed = pd.to_datetime(column, format=date_format, errors="coerce").isna() & column.notna()
    except (ValueError, TypeError, OverflowError):
        return 0
    return int(failed.to_numpy().argmax()) if failed.any() else None


def _in_format(column, date_format):
    try:
        return pd.to_datetime(column, format=date_format)
    except (ValueError, TypeError, OverflowError):
        return None


def _dates_as_told(column, path, date_format):
    """--date_format: the column read in that format, or refused naming the first value it does not read (and,
    where the value reads with day and month swapped, that the order is the cause)."""
    dates = _in_format(column, date_format)
    if dates is not None:
        return dates
    _refuse_changing_offsets(column, path)
    row = _first_failure(column, date_format)
    where, other = ("" if row is None else f" ({column.iloc[row]!r} in row {row + 1})"), _swapped(date_format)
    if row is not None and other is not None and _in_format(column.iloc[row:row + 1], other) is not None:
        where += (f": the dates are {'month' if _day_first(date_format) else 'day'} first, which --date_format "
                  f"{other!r} reads")
    raise UserError(f"{path}: the 'date' column does not match --date_format {date_format!r}{where}; give the "
                    "format the column is written in, or leave --date_format out")


@contextlib.contextmanager
def _quiet_day_first_guess():
    """pandas warns, in a Python warning of two lines, where it reads a date in an order other than its dayfirst
    argument asks (13.07.2016 day first; ISO 8601 asked for the day first): the order is decided here
    (_day_and_month_orders), so the warning would say nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Parsing dates in .* format when dayfirst=", category=UserWarning)
        yield


def _day_and_month_orders(first):
    """(month-first, day-first) formats of a first date whose day and month could be either way round
    (01.07.2016, 07/01/2016), as pandas guesses them; None where the date decides (13.07.2016, ISO 8601's
    year-month-day, which pandas would offer as year-day-month too)."""
    from pandas.tseries.api import guess_datetime_format

    with _quiet_day_first_guess():
        month_first, day_first = guess_datetime_format(first), guess_datetime_format(first, dayfirst=True)
    if None in (month_first, day_first) or month_first == day_first or day_first.startswith("%Y"):
        return None
    return month_first, day_first


def _regularity(dates):
    """The share of steps equal to the most common step: a step in time, or in calendar months (monthly data,
    whose steps in days vary)."""
    steps = dates.diff().iloc[1:]
    if len(steps) == 0:
        return 1.0
    by_time = steps.value_counts()
    months = (dates.dt.year * 12 + dates.dt.month).diff().iloc[1:].value_counts()
    by_month = months.iloc[0] if len(months) and months.index[0] > 0 else 0
    return max(by_time.iloc[0] if len(by_time) else 0, by_month) / len(steps)


def _dates_in_either_order(column, path, first, orders, order_matters):
    """A column whose first date reads month first and day first alike, decided by the whole column: the order
    that reads every value; of two, the one whose dates increase, and then at the more regular steps (10 days
    of hours written day first, 01.07.2016 00:00 ..., read month first are January to October at irregular
    steps). Two readings alike in both are refused, naming --date_format, where the dates are used."""
    month_first, day_first = orders
    parsed = {fmt: dates for fmt in orders if (dates := _in_format(column, fmt)) is not None}
    if not parsed:
        _refuse_changing_offsets(column, path)
        failures = {fmt: _first_failure(column, fmt) for fmt in orders}
        if None in failures.values():  # no single value to blame
            where = _first_unparsable(column) or "in neither day-first nor month-first order"
        else:
            row = max(failures.values())
            where = f"{column.iloc[row]!r} in row {row + 1}"
            if failures[day_first] > failures[month_first]:  # the rows before it read day first alone
                where += f"; the dates before it are day first ({day_first!r}), not month first as pandas reads them"
        raise UserError(f"{path}: the 'date' column cannot be parsed as timestamps ({where}); "
                        "fix the column or remove it")
    if len(parsed) == 1 or parsed[month_first].equals(parsed[day_first]):
        return next(iter(parsed.values()))
    increasing = [fmt for fmt in orders if parsed[fmt].is_monotonic_increasing] or list(orders)
    score = {fmt: _regularity(parsed[fmt]) for fmt in increasing}
    best = [fmt for fmt in increasing if score[fmt] == max(score.values())]
    if len(best) == 1 or not order_matters:  # unused dates (a corpus' files): either order does
        return parsed[best[0]]
    row = int((parsed[month_first] != parsed[day_first]).to_numpy().argmax())  # a date the orders read apart
    as_month_first, as_day_first = parsed[month_first].iloc[row], parsed[day_first].iloc[row]
    raise UserError(f"{path}: the 'date' column reads as dates with the day first or the month first alike "
                    f"({column.iloc[row]!r} is {as_day_first.day} {as_day_first:%B %Y} or {as_month_first.day} "
                    f"{as_month_first:%B %Y}), at regular steps both ways; give the order with --date_format "
                    f"{day_first!r} (day first) or {month_first!r} (month first)")


def _parse_dates(column, path, date_format=None, order_matters=True):
    """Timestamps in increasing order. Rows are the model's steps, so a row out of order is
    refused (sorting could hide a mangled file); a repeated timestamp is allowed, with one warning.
    `date_format` (--date_format) reads them in that format; without it a date whose day and month could be
    either way round is decided by the whole column. `order_matters`: False where the dates are not used."""
    first = _first_text(column)
    orders = None if first is None or date_format is not None else _day_and_month_orders(first)
    if first is not None and date_format is not None:
        dates = _dates_as_told(column, path, date_format)
    elif orders is not None:
        dates = _dates_in_either_order(column, path, first, orders, order_matters)
    else:
        try:
            with _quiet_day_first_guess():
                dates = pd.to_datetime(column)
        except (ValueError, TypeError, OverflowError) as exc:
            _refuse_changing_offsets(column, path)
            with _quiet_day_first_guess():
                where = _first_unparsable(column) or str(exc).splitlines()[0]
            raise UserError(f"{path}: the 'date' column cannot be parsed as timestamps ({where}); "
                            "fix the column or remove it") from None
    missing = dates.isna()
    require(not missing.any(), f"{path}: the 'date' column is empty in row {missing.idxmax() + 1} "
                               f"({missing.sum()} row(s) in all); fill in the dates or remove the column")
    stamps = dates.to_numpy()
    backwards = np.flatnonzero(stamps[1:] < stamps[:-1])
    if len(backwards):
        row = backwards[0] + 1  # 0-based index of the first row earlier than the row before it
        raise UserError(f"{path}: dates are not increasing: row {row + 1} ({dates.iloc[row]}) comes after row {row} "
                        f"({dates.iloc[row - 1]}); sort the file by its 'date' column")
    repeats = np.flatnonzero(stamps[1:] == stamps[:-1])
    if len(repeats) and distributed.env_rank() == 0:  # every rank reads the file: warn once
        row = repeats[0] + 1
        logger.warning(f"{path}: {len(repeats)} row(s) repeat the timestamp before them, the first row "
                       f"{row + 1} ({dates.iloc[row]}); each row still counts as one step, so drop or merge them "
                       "if they are not")
    return dates


@functools.lru_cache(maxsize=8)
def _read_file(path, mtime, date_format=None, dates_used=True):
    """Read a data file once per process (train/val/test share it)."""
    del mtime  # only part of the cache key, so an edited file is re-read
    try:
        if path.endswith(".npy"):
            array = np.load(path)
            array = array[:, None] if array.ndim == 1 else array
            require(array.ndim == 2, f"{path}: expected a [time, channels] array, got shape {array.shape}")
            return _frame_to_table(pd.DataFrame(array, columns=[str(i) for i in range(array.shape[1])]), path)
        if path.endswith((".txt", ".txt.gz")):
            frame = _read_raw_text(path)
        else:
            frame = _read_csv(path)
        frame.columns = [str(c) for c in frame.columns]
    except pd.errors.EmptyDataError:
        raise UserError(f"{path} is empty; point --root_path/--data_path at a file with data") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    return _frame_to_table(frame, path, date_format, dates_used)


def read_table(args):
    """The Table that --data (synthetic or a file under --root_path) names."""
    if args.data == "synthetic":
        frame = make_synthetic(rows=args.synthetic_rows, channels=args.synthetic_channels, seed=args.synthetic_seed)
        return _frame_to_table(frame, "synthetic data")
    path = os.path.join(args.root_path, args.data_path)
    require(os.path.isfile(path), f"data file not found: {path}; set --root_path and --data_path (or use --data synthetic)")
    return read_file(path, getattr(args, "date_format", None))


def read_file(path, date_format=None, dates_used=True):
    """The Table of one file, read once per process while the file is unchanged. `date_format`: --date_format;
    `dates_used`: False where the dates are dropped (each series of a corpus), so their order need not be known."""
    return _read_file(path, os.path.getmtime(path), date_format, dates_used)


def read_file_once(path):
    """The Table of one file, not kept: for reading many files one after another (a corpus build, which keeps
    no dates)."""
    return _read_file.__wrapped__(path, None, None, False)
