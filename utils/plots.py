"""Pictures of a run, as PNG files (matplotlib, Agg backend).

Pure drawing: callers hand over numbers, these functions know nothing of models, DDP or
files other than the one they write. matplotlib is imported on first use, so runs with
--no_plots (and every import of this module) do not pay for it. `pyplot` and `save_png` also
serve the results-table picture of benchmarks/report.py.
"""
import math
import textwrap

from utils.files import atomic_write

COLORS = {"history": "0.55", "truth": "black", "forecast": "tab:red", "train": "tab:blue", "vali": "tab:orange",
          "test": "tab:green", "lr": "0.45"}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe on headless nodes and in worker processes
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path):
    """Write the figure through atomic_write (a reader never sees half a PNG), then free it."""
    try:
        atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    finally:
        pyplot().close(fig)
    return path


def plot_forecasts(path, windows, title, ylabel):
    """Forecast versus ground truth, one panel per window.

    windows: list of dicts with `history` (the input, L values), `truth` and `forecast`
    (H values each) and a `label`; optionally `bands`, {name: (lower, upper)} of H values each (a
    probabilistic forecast's intervals, e.g. "50 %", "80 %", "90 %": widest drawn palest, under the lines).
    The x axis counts steps from the first forecast step.
    """
    plt = pyplot()
    cols = 2 if len(windows) > 1 else 1
    rows = math.ceil(len(windows) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 2.9 * rows + 0.8), squeeze=False)
    for ax, w in zip(axes.flat, windows):
        n_hist, horizon = len(w["history"]), len(w["truth"])
        past, future = range(-n_hist, 0), range(horizon)
        ax.plot(past, w["history"], color=COLORS["history"], lw=1.0, label="input")
        # Truth and forecast start from the last input value, so the lines join the history.
        joined = range(-1, horizon)
        bands = sorted(w.get("bands", {}).items(), key=lambda band: -_width(band[1]))  # widest first: under
        for k, (name, (lower, upper)) in enumerate(bands):
            ax.fill_between(future, lower, upper, color=COLORS["forecast"], alpha=0.12 + 0.12 * k, lw=0,
                            label=f"{name} interval")
        ax.plot(joined, [w["history"][-1], *w["truth"]], color=COLORS["truth"], lw=1.2, label="ground truth")
        ax.plot(joined, [w["history"][-1], *w["forecast"]], color=COLORS["forecast"], lw=1.4, label="median" if bands else "forecast")
        ax.axvline(-0.5, color="0.3", ls=":", lw=0.8)
        ax.axvspan(-0.5, horizon - 0.5, color=COLORS["forecast"], alpha=0.05)
        ax.set_xlim(past.start, future.stop)
        ax.set_title(w["label"], fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.25)
    for ax in axes.flat[len(windows):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("steps from the forecast start", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97 - 0.03 / rows))
    return save_png(fig, path)


def _width(band):
    lower, upper = band
    return sum(u - l for l, u in zip(lower, upper))


def plot_training(path, history, title):
    """Train / validation / test loss per evaluation (left axis) and the learning rate (right axis),
    against the epoch, or against the optimizer step when evaluations fall mid-epoch (--eval_steps).

    title: a heading, optionally a newline and a small-print line (e.g. the setting)."""
    plt = pyplot()
    unit = "step" if any(h.get("partial_epoch") for h in history) else "epoch"
    epochs = [h[unit] for h in history]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for key, name in (("train_loss", "train"), ("vali_loss", "vali"), ("test_loss", "test")):
        if any(h.get(key) is None for h in history):  # --test_every_epoch false: no test loss during training
            continue
        ax.plot(epochs, [h[key] for h in history], marker="o", ms=3.5, lw=1.4, color=COLORS[name], label=f"{name} loss")
    best = min(history, key=lambda h: h["vali_loss"])
    ax.plot([best[unit]], [best["vali_loss"]], marker="*", ms=13, color=COLORS["vali"], ls="none",
            markeredgecolor="black", label=f"best vali ({unit} {best[unit]})")
    ax.set_xlabel(unit)
    ax.set_ylabel("loss")
    ax.grid(alpha=0.25)
    if len(epochs) <= 15:
        ax.set_xticks(epochs)
    else:
        ax.xaxis.get_major_locator().set_params(integer=True)
    lr_ax = ax.twinx()
    lr = [h["lr"] for h in history]
    span = f"{lr[0]:.3g}" if min(lr) == max(lr) else f"{lr[0]:.3g} to {lr[-1]:.3g}"
    lr_ax.step(epochs, lr, where="mid", color=COLORS["lr"], ls="--", lw=1.1, label=f"learning rate ({span})",
               marker="_" if len(epochs) == 1 else None, ms=14)
    if min(lr) > 0:  # halving schedules span decades; a log axis also labels 1e-4 readably
        lr_ax.set_yscale("log")
    else:
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    lr_ax.set_ylabel("learning rate", color=COLORS["lr"])
    lr_ax.tick_params(axis="y", which="both", colors=COLORS["lr"], labelsize=8)
    if len(epochs) == 1:
        ax.set_xlim(epochs[0] - 0.5, epochs[0] + 0.5)
    handles = ax.get_legend_handles_labels()[0] + lr_ax.get_legend_handles_labels()[0]
    # Below the axes: inside, it would hide the curves' start or the learning rate.
    fig.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="lower center", ncol=len(handles),
               frameon=False)
    heading, _, detail = title.partition("\n")
    ax.set_title(heading, fontsize=10, loc="left")
    if detail:
        fig.text(0.01, 0.985, "\n".join(textwrap.wrap(detail, 110)), fontsize=7, color="0.35", va="top")
    fig.tight_layout(rect=(0, 0.07, 1, 0.94 if detail else 1))
    return save_png(fig, path)

