"""The one interface of a prepared data set, whichever --data it came from.

data_factory.prepared_data picks the class once, from --data: TableData (ETT, custom,
synthetic: one multivariate series) or UnivariateData (a corpus of single series). The
experiment reads only these members, so it never asks which kind it holds.
"""
import hashlib
from abc import ABC, abstractmethod

import numpy as np


class ForecastData(ABC):
    """A prepared (read, split, scaled) data set.

    Every implementation sets these attributes:
      columns             list of str, the target last
      mark_dim            int, time features per step (0 for undated data)
      scaler              the fitted sklearn.preprocessing.StandardScaler of the whole data set,
                          or None (--scale false, or one scaler per series)
      per_series_scaling  bool: every series has its own scaler, so results have no single
                          original scale (--inverse and --do_predict refuse)
      dates               pd.Series of timestamps, or None (undated data)
    """

    # True for the pre-training kinds (univariate, corpus): training shuffles with an O(1)-memory
    # permutation (data_provider.permutation) instead of DistributedSampler's randperm of every window
    constant_memory_shuffle = False

    MEMBERS = ("columns", "mark_dim", "scaler", "per_series_scaling", "dates", "series_histories",
               "window_dataset", "forecast_date", "future_input", "content_hash", "nbytes",
               "constant_memory_shuffle")

    @abstractmethod
    def content(self):
        """Everything the windows are cut from, as (name, numpy array or plain value) pairs:
        the scaled rows, time features and split borders."""

    def content_hash(self):
        """A short hash of the prepared data (content(), the columns, the scaler's statistics),
        computed once: last.pth records it every epoch and the ranks compare it before training."""
        cached = getattr(self, "_content_hash", None)
        if cached is None:
            digest = hashlib.blake2b(repr((list(self.columns), self.mark_dim)).encode(), digest_size=8)
            parts = list(self.content())
            if self.scaler is not None:
                parts += [("mean", self.scaler.mean_), ("scale", self.scaler.scale_)]
            for name, part in parts:
                if isinstance(part, np.ndarray):
                    digest.update(f"{name}{part.dtype}{part.shape}".encode())
                    digest.update(np.ascontiguousarray(part).data)
                else:
                    digest.update(f"{name}{part!r}".encode())
            cached = self._content_hash = digest.hexdigest()
        return cached

    def nbytes(self):
        """Bytes of the arrays the windows are cut from: about what a GPU holds when the splits
        live there (val and test overlap train by one input length each)."""
        return sum(part.nbytes for _, part in self.content() if isinstance(part, np.ndarray))

    @abstractmethod
    def window_dataset(self, flag, window, with_marks=True):
        """Every window of split `flag` as a Dataset with `__getitems__` (one gather per batch);
        raises UserError when the split holds no window."""

    def series_histories(self, flag, window, original=False):
        """(histories, series): each series' values before the first forecast step of split `flag`, float64
        [T_i, C] arrays (the file's own values of the scored columns with `original`), and the series each
        window of window_dataset(flag, window) belongs to. MASE's scale comes from them, once per series.
        None where a data kind keeps no history at hand (a corpus larger than memory)."""
        return None

    @abstractmethod
    def forecast_date(self, flag, window, i):
        """pd.Timestamp of the first forecast step of window i of split `flag`, or None."""

    @abstractmethod
    def future_input(self, window, freq, embed):
        """(dataset of one window, index, last row's label): the last window.x_len rows, then the
        horizon with unknown (zero) values and future time features. index is the horizon's
        DatetimeIndex named "date", or RangeIndex(1..horizon) named "step" for undated data."""
