"""Exp_Short_Term_Forecast: TSLib's short-term forecasting of M4 (`--task_name short_term_forecast --data m4`), and
of M1, M3 and Tourism (`--data m1 | m3 | tourism`, data_provider.competitions) the same way: their forecasts go to
<results_dir>/<data>_results/<model>/, scored with M4's sMAPE, MAPE and MASE terms (fev's MASE), OWA against
Naive2 computed here for M1 and M3 only, and no summary across frequencies.

Training is Exp_Forecast's (global batches, one window per series and epoch, data_provider.m4), on TSLib's
masked SMAPE (utils.metrics.m4_loss). What differs is the evaluation, TSLib's Exp_Short_Term_Forecast
(thuml/Time-Series-Library 4e938a1; facts only):
- validation: the training loss over every series' forecast of its test horizon (TSLib validates on the
  test set), from per-series sums and one all_reduce: the same on any number of processes;
- test: every series forecast once from the last seq_len steps of its training part; each rank forecasts
  its contiguous share, rank 0 gathers them in series order and writes <results_dir>/m4_results/<model>/
  <Frequency>_forecast.csv (TSLib's ./m4_results/<model>/), scores this frequency (sMAPE, MAPE, MASE, OWA
  against Naive2: utils.m4), and once all six frequencies' files are there, TSLib's summary table
  (rows SMAPE, MAPE, MASE, OWA; columns Yearly, Quarterly, Monthly, Others, Average) into m4_summary.csv.
"""
import logging
import os

import torch

from data_provider.competitions import COMPETITIONS, OWA_DEFINED
from data_provider.data_factory import data_provider, prepared_data
from data_provider.m4 import read_m4
from exp.exp_forecast import Exp_Forecast, _load_evaluated
from exp.forward import forward
from exp.outputs import require_outputs_writable
from utils import ddp, distributed, m4
from utils.metrics import m4_loss
from utils.progress import RESULT, EvaluationProgress, progress_mode
from utils.tools import eval_mode

logger = logging.getLogger("tsl")


class LossSums:
    """What Exp_Forecast's validation reads of an evaluation: metrics()[--loss], objective_loss."""

    objective_loss = None

    def __init__(self, name, value):
        self.name, self.value = name, value

    def metrics(self):
        return {self.name: self.value}


def m4_results_dir(args):
    """<results_dir>/<data>_results/<model>: TSLib's m4_results for M4, m1_results, m3_results, tourism_results."""
    return os.path.join(args.results_dir, f"{args.data}_results", args.model)


class Exp_Short_Term_Forecast(Exp_Forecast):
    @torch.no_grad()
    def forecasts(self, loader, stage):
        """(forecasts, targets) of this rank's share of the series, each [n, horizon] float32, in series order."""
        preds, trues = [], []
        progress = EvaluationProgress(stage, len(loader), progress_mode(self.args.quiet))
        with eval_mode(self.raw_model):  # no DDP wrapper: no collective inside the loop but FSDP2's
            for batch in self.paired(loader, loader, stage):  # --fsdp: each forward gathers
                with self.autocast():
                    pred, true = forward(self.raw_model, batch, self.args, stage, self.device)
                if self.objective is not None:  # a probabilistic forecast (a release's own objective): its median
                    pred = self.objective.point(pred)
                preds.append(pred.float()[..., 0])  # kept on the device: one copy to the host after the loop
                trues.append(true[..., 0])
                progress.update()
        progress.close()
        horizon = self.args.pred_len
        return tuple(torch.cat(parts).cpu() if parts else torch.zeros(0, horizon) for parts in (preds, trues))

    def evaluate(self, loader, stage, original=None, keep_windows=False, scoring=None):
        """The global mean of the training loss over every series' horizon (TSLib's vali): each series' sum of
        loss terms alone (whatever batch or rank it is in), added in float64 over series and ranks."""
        pred, true = self.forecasts(loader, stage)
        per_series = m4_loss(pred, true, self.args.loss, dim=-1)  # each series' own, on the host as before
        total, count = distributed.all_reduce_sum([float(per_series.double().sum()) * self.args.pred_len,
                                                   float(true.numel())])
        return LossSums(self.args.loss.lower(), total / count if count else float("nan"))

    def test(self, setting, checkpoint=None, pretrained=False):
        """Forecast every series of the frequency, write TSLib's forecast file, score it (rank 0)."""
        args = self.args
        if checkpoint:
            require_outputs_writable(args, setting)
            ddp.load_on_main(self.raw_model, _load_evaluated, checkpoint, pretrained, self.device)
        vali_loader, test_loader = (data_provider(args, flag, self.device)[1] for flag in ("val", "test"))
        vali_loss = self.vali(vali_loader, "val")
        pred, _ = self.forecasts(test_loader, "test")
        gathered = distributed.gather_on_main(pred)
        metrics = {"vali_loss": vali_loss, "test_windows": len(test_loader.dataset),
                   "test_split_windows": len(test_loader.dataset)}
        if gathered is not None:
            metrics.update(score_frequency(args, torch.cat(gathered).double().numpy()))
            owa = f" owa {metrics['owa']:.6f}" if "owa" in metrics else ""
            logger.log(RESULT, f"test {setting}: {args.seasonal_patterns} smape {metrics['smape']:.6f} mape "
                               f"{metrics['mape']:.6f} mase {metrics['mase']:.6f}{owa} (vali "
                               f"{vali_loss:.6f}, {metrics['test_windows']} series, {distributed.world_size()} processes)")
            if "m4_summary" in metrics:
                logger.log(RESULT, "M4 summary (TSLib's m4_summary):\n" + m4.summary_table(metrics["m4_summary"]))
        return metrics


def score_frequency(args, forecasts):
    """This frequency's figures, its forecast file written; the summary too once all six files exist."""
    data = prepared_data(args)
    pattern = args.seasonal_patterns
    folder = m4_results_dir(args)
    m4.write_forecasts(folder, pattern, forecasts)
    if args.data in COMPETITIONS:  # M1, M3, Tourism: Naive2 computed here (no organisers' file to read)
        naive = m4.naive2_forecasts(None, data.sets, {pattern: data.ids})[pattern]
    else:
        naive = m4.naive2_forecasts(args.root_path, data.sets, {pattern: data.ids})[pattern]
    smape, mape, mase, naive_smape, naive_mase = m4.group_figures(forecasts, naive, data.sets, pattern)
    figures = {"smape": smape, "mape": mape, "mase": mase, "owa": (mase / naive_mase + smape / naive_smape) / 2,
               "forecast_file": m4.forecast_file(folder, pattern)}
    if args.data in COMPETITIONS:
        if args.data not in OWA_DEFINED:  # Tourism's reference was not Naive2: no OWA
            del figures["owa"]
        return figures  # one frequency is the benchmark: no summary across frequencies
    missing = m4.missing_forecasts(folder)
    if missing:
        logger.info(f"M4 summary: after all six frequencies are forecast into {folder} (missing: {', '.join(missing)})")
        return figures
    figures["m4_summary"] = summary_of_folder(folder, args.root_path)
    return figures


def summary_of_folder(folder, root_path):
    """TSLib's m4_summary of the six <Frequency>_forecast.csv files in `folder`, written beside them."""
    ids, _, _, sets = read_m4(root_path)
    forecasts = {p: m4.read_forecasts(folder, p) for p in m4.SEASONAL_PATTERNS}
    summary = m4.m4_summary(forecasts, m4.naive2_forecasts(root_path, sets, ids), sets)
    lines = ["metric," + ",".join(m4.COLUMNS)]
    lines += [f"{row}," + ",".join(repr(float(summary[row][c])) for c in m4.COLUMNS) for row in m4.ROWS]
    path = os.path.join(folder, "m4_summary.csv")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    return {row: {c: float(v) for c, v in values.items()} for row, values in summary.items()}

