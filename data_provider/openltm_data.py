"""OpenLTM's `--data` names, read by our data kinds with OpenLTM's split rules.

OpenLTM (data_provider/data_factory.py's data_dict, classes in data_provider/data_loader.py) names a
data set by its loader class. Each is one of our kinds here, so its scripts run unchanged:

| OpenLTM --data | our kind | files | split of each series (val and test start seq_len early) |
|---|---|---|---|
| MultivariateDatasetBenchmark | table (all columns, one window of every channel) | --data_path | ETT borders for a file named ETTh/ETTh1/ETTh2/ETTm/ETTm1/ETTm2, else 70/10/20 % |
| UnivariateDatasetBenchmark | univariate (each channel a series) | --data_path | as above |
| Utsd | univariate | every .csv under --root_path | 90 % / rest / int(rows x 0.1 / 2) (UTSD's split=0.9) |
| Utsd_Npy | univariate | every .npy under --root_path | as Utsd |
| Era5_Pretrain | univariate | --data_path (.npy), its first int(0.8 x columns) | 70/10/20 % |

Each split is scaled with its own series' (table: the file's) training rows, as OpenLTM's
StandardScaler does. A corpus larger than memory stays `--data corpus` (split 70/10/20 when built).
"""
import os
from dataclasses import dataclass

from data_provider.splits import split_ends

TABLE, UNIVARIATE = "table", "univariate"
UTSD_TRAIN_SHARE = 0.9  # OpenLTM's UTSD and UTSD_Npy: split=0.9
ERA5_TRAIN_COLUMNS = 0.8  # OpenLTM's Dataset_ERA5_Pretrain: Train_S = int(S * 0.8)
# OpenLTM tells ETT files by the name before the first dot; 'ETTh' and 'ETTm' count too
_ETT_STEMS = {"ETTh": "ETTh1", "ETTh1": "ETTh1", "ETTh2": "ETTh2", "ETTm": "ETTm1", "ETTm1": "ETTm1", "ETTm2": "ETTm2"}


@dataclass(frozen=True)
class OpenLTMData:
    kind: str  # TABLE or UNIVARIATE
    files: str = None  # a glob under --root_path; None: --data_path
    split: str = "by name"  # "by name" (ETT borders or 70/10/20), "utsd" (90/5/5) or "ratio" (70/10/20)
    column_share: float = 1.0  # the leading share of each file's columns that is read


OPENLTM_DATA = {
    "MultivariateDatasetBenchmark": OpenLTMData(TABLE),
    "UnivariateDatasetBenchmark": OpenLTMData(UNIVARIATE),
    "Utsd": OpenLTMData(UNIVARIATE, files="**/*.csv", split="utsd"),
    "Utsd_Npy": OpenLTMData(UNIVARIATE, files="**/*.npy", split="utsd"),
    "Era5_Pretrain": OpenLTMData(UNIVARIATE, split="ratio", column_share=ERA5_TRAIN_COLUMNS),
}


def utsd_split_ends(total_rows, share=UTSD_TRAIN_SHARE):
    """Where train, val and test end in OpenLTM's UTSD: int(rows x 0.9) training rows, int(rows x (1 - 0.9) / 2)
    test rows (computed as OpenLTM computes it, float rounding included), the rest validation."""
    n_train = int(total_rows * share)
    n_test = int(total_rows * (1 - share) / 2)
    return [n_train, total_rows - n_test, total_rows]


def ends_of_file(spec, path, total_rows):
    """Split ends of one file's series under OpenLTM data set `spec` (see the table above)."""
    if spec.split == "utsd":
        return utsd_split_ends(total_rows)
    if spec.split == "ratio":
        return split_ends("", total_rows)
    stem = os.path.basename(path).split(".")[0]
    return split_ends(_ETT_STEMS.get(stem, stem), total_rows)
