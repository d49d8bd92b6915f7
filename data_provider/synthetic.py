"""The built-in data set: deterministic, hourly, multivariate, with a dependent target.

Channels x0..x{n-2} mix a daily and a weekly cycle, a trend and AR(1) noise; the target
`OT` is a lagged combination of the others plus its own daily cycle, so models that
use cross-channel information can beat univariate ones.
"""
import numpy as np
import pandas as pd


def make_synthetic(rows=5000, channels=7, seed=2021):
    rng = np.random.default_rng(seed)
    t = np.arange(rows, dtype=np.float64)
    covariates = []
    for _ in range(channels - 1):
        daily = rng.uniform(0.5, 2.0) * np.sin(2 * np.pi * t / 24 + rng.uniform(0, 2 * np.pi))
        weekly = rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * t / 168 + rng.uniform(0, 2 * np.pi))
        trend = rng.uniform(-1.0, 1.0) * t / rows
        shocks = rng.normal(0.0, 0.3, rows)
        noise = np.empty(rows)
        noise[0] = shocks[0]
        for i in range(1, rows):
            noise[i] = 0.7 * noise[i - 1] + shocks[i]
        covariates.append(daily + weekly + trend + noise + rng.uniform(-2, 2))
    weights = rng.uniform(-1.0, 1.0, channels - 1)
    lags = rng.integers(1, 12, channels - 1)
    target = 0.5 * np.sin(2 * np.pi * t / 24) + rng.normal(0.0, 0.2, rows)
    for w, lag, x in zip(weights, lags, covariates):
        target += w * np.concatenate([np.full(lag, x[0]), x[:-lag]])
    frame = pd.DataFrame({f"x{i}": x for i, x in enumerate(covariates)})
    frame["OT"] = target
    frame.insert(0, "date", pd.date_range("2020-01-01", periods=rows, freq="h"))
    return frame
