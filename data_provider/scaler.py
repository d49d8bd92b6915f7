"""StandardScaler: scikit-learn's, computed the same way to the last bit, without importing it.

Importing sklearn.preprocessing takes about a second (it pulls in scipy.stats), paid by every
process at start: each DDP worker, each run of a script. The data path needs only this scaler.
tests/test_data.py holds it equal to scikit-learn's, bit for bit, on the real and built-in data.
"""
import numpy as np


class StandardScaler:
    """Per-column mean and population standard deviation (ddof 0) of the rows it is fitted on;
    a column that is constant up to rounding keeps scale 1, as in scikit-learn."""

    mean_ = scale_ = var_ = None

    def fit(self, values):
        x = np.asarray(values, dtype=np.float64)
        n = x.shape[0]
        self.mean_ = x.sum(axis=0) / n
        # scikit-learn's corrected two-pass variance (Chan, Golub and LeVeque), step for step
        centred = x - self.mean_
        correction = centred.sum(axis=0)
        centred **= 2
        self.var_ = (centred.sum(axis=0) - correction ** 2 / n) / n
        eps = np.finfo(np.float64).eps
        constant = self.var_ <= n * eps * self.var_ + (n * self.mean_ * eps) ** 2
        self.scale_ = np.where(constant, 1.0, np.sqrt(self.var_))
        return self

    def transform(self, values):
        return (np.asarray(values, dtype=np.float64) - self.mean_) / self.scale_

    def inverse_transform(self, values):
        return np.asarray(values, dtype=np.float64) * self.scale_ + self.mean_
