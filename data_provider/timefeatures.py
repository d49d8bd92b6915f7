"""Calendar features of a timestamp column (TSLib's `timeF` encoding, values in [-0.5, 0.5])."""
import numpy as np
import pandas as pd

from utils.errors import UserError


def _scaled(values, span):
    return np.asarray(values, dtype=np.float64) / span - 0.5


_FEATURES = {
    "second": lambda d: _scaled(d.dt.second, 59.0),
    "minute": lambda d: _scaled(d.dt.minute, 59.0),
    "hour": lambda d: _scaled(d.dt.hour, 23.0),
    "weekday": lambda d: _scaled(d.dt.day_of_week, 6.0),
    "monthday": lambda d: _scaled(d.dt.day - 1, 30.0),
    "yearday": lambda d: _scaled(d.dt.day_of_year - 1, 365.0),
    "month": lambda d: _scaled(d.dt.month - 1, 11.0),
    "week": lambda d: _scaled(d.dt.isocalendar().week.astype(int) - 1, 52.0),
}

# Which features each --freq gets: the finer the frequency, the more calendar detail.
_BY_FREQ = {
    "y": [],
    "m": ["month"],
    "w": ["monthday", "week"],
    "d": ["weekday", "monthday", "yearday"],
    "b": ["weekday", "monthday", "yearday"],
    "h": ["hour", "weekday", "monthday", "yearday"],
    "t": ["minute", "hour", "weekday", "monthday", "yearday"],
    "s": ["second", "minute", "hour", "weekday", "monthday", "yearday"],
}

FREQ_ALIASES = {"min": "t", "ms": "s"}


def normalise_freq(freq):
    """'h', '15min', 't', 'D' ... -> one of _BY_FREQ's keys (the unit, without multiplier)."""
    unit = freq.lstrip("0123456789").lower()
    unit = FREQ_ALIASES.get(unit, unit)
    if unit not in _BY_FREQ:
        raise UserError(f"unknown --freq '{freq}'; use one of s, t (minutes), h, d, b, w, m, y, optionally with a multiplier like 15min")
    return unit


def time_features(dates, freq, embed="timeF"):
    """[T, F] float32 array of calendar features for a datetime Series."""
    dates = pd.Series(pd.to_datetime(dates)).reset_index(drop=True)
    if embed == "none":
        return np.zeros((len(dates), 0), dtype=np.float32)
    if embed == "timeF":
        names = _BY_FREQ[normalise_freq(freq)]
        if not names:
            return np.zeros((len(dates), 0), dtype=np.float32)
        return np.stack([_FEATURES[n](dates) for n in names], axis=1).astype(np.float32)
    # TSLib's integer encoding (embed fixed/learned): month, day, weekday, hour[, minute//15]
    cols = [dates.dt.month, dates.dt.day, dates.dt.day_of_week, dates.dt.hour]
    if normalise_freq(freq) in ("t", "s"):
        cols.append(dates.dt.minute // 15)
    return np.stack([np.asarray(c) for c in cols], axis=1).astype(np.float32)


def freq_offset(freq):
    """--freq as a calendar step: 'h' -> 1 hour, '15min' -> 15 minutes, 'b' -> 1 business day, 'm' -> 1 month."""
    unit = normalise_freq(freq)
    digits = freq[: len(freq) - len(freq.lstrip("0123456789"))]
    n = int(digits) if digits else 1
    if unit == "b":
        return pd.offsets.BDay(n)
    names = {"s": "seconds", "t": "minutes", "h": "hours", "d": "days", "w": "weeks", "m": "months", "y": "years"}
    return pd.DateOffset(**{names[unit]: n})


def future_dates(last, freq, n):
    """The n timestamps after `last`, one --freq step apart (last + k steps, so a month
    step from Jan 31 gives Feb 29, Mar 31, Apr 30 rather than drifting to the 29th)."""
    offset = freq_offset(freq)
    return pd.DatetimeIndex([pd.Timestamp(last) + offset * k for k in range(1, n + 1)])
