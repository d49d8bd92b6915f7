"""Pictures of a run and of a results table, as PNG files (matplotlib, Agg backend).

Pure drawing: callers hand over numbers, these functions know nothing of models, DDP or
files other than the one they write. matplotlib is imported on first use, so runs with
--no_plots (and every import of this module) do not pay for it.
"""
import math
import os
import textwrap

COLORS = {"history": "0.55", "truth": "black", "forecast": "tab:red", "train": "tab:blue", "vali": "tab:orange",
          "test": "tab:green", "lr": "0.45"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe on headless nodes and in worker processes
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    """Write atomically (temp file, rename): a reader never sees half a PNG."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp")
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)
    _pyplot().close(fig)
    return path


def plot_forecasts(path, windows, title, ylabel):
    """Forecast versus ground truth, one panel per window.

    windows: list of dicts with `history` (the input, L values), `truth` and `forecast`
    (H values each) and a `label`. The x axis counts steps from the first forecast step.
    """
    plt = _pyplot()
    cols = 2 if len(windows) > 1 else 1
    rows = math.ceil(len(windows) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 2.9 * rows + 0.8), squeeze=False)
    for ax, w in zip(axes.flat, windows):
        n_hist, horizon = len(w["history"]), len(w["truth"])
        past, future = range(-n_hist, 0), range(horizon)
        ax.plot(past, w["history"], color=COLORS["history"], lw=1.0, label="input")
        # Truth and forecast start from the last input value, so the lines join the history.
        joined = range(-1, horizon)
        ax.plot(joined, [w["history"][-1], *w["truth"]], color=COLORS["truth"], lw=1.2, label="ground truth")
        ax.plot(joined, [w["history"][-1], *w["forecast"]], color=COLORS["forecast"], lw=1.4, label="forecast")
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
    fig.legend(handles, labels, loc="upper right", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97 - 0.03 / rows))
    return _save(fig, path)


def plot_training(path, history, title):
    """Train / validation / test loss per epoch (left axis) and the learning rate (right axis).

    title: a heading, optionally a newline and a small-print line (e.g. the setting)."""
    plt = _pyplot()
    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for key, name in (("train_loss", "train"), ("vali_loss", "vali"), ("test_loss", "test")):
        ax.plot(epochs, [h[key] for h in history], marker="o", ms=3.5, lw=1.4, color=COLORS[name], label=f"{name} loss")
    best = min(history, key=lambda h: h["vali_loss"])
    ax.plot([best["epoch"]], [best["vali_loss"]], marker="*", ms=13, color=COLORS["vali"], ls="none",
            markeredgecolor="black", label=f"best vali (epoch {best['epoch']})")
    ax.set_xlabel("epoch")
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
    return _save(fig, path)


def plot_report(path, rows, per_row=3):
    """Bar chart of test MSE per model and horizon, one panel per (data set, features, input).

    rows: utils.report.summarise's dicts (data, features, input, model, recipe, horizon, mse,
    mse_std: None for one seed, reference_mse: None without a published figure). Error bars are
    the std over seeds; a black line over a bar is the published figure.
    """
    from utils.report import recipe_label

    plt = _pyplot()
    recipes = {}
    for r in rows:
        recipes.setdefault(r["model"], set()).add(r["recipe"])

    def series(r):  # a model trained with several recipes gets one bar per recipe
        return r["model"] if len(recipes[r["model"]]) == 1 else f"{r['model']} ({recipe_label(r)})"

    rows = [dict(r, series=series(r)) for r in rows]
    panels = {}
    for r in rows:
        panels.setdefault((r["data"], r["features"], r["input"]), []).append(r)
    panel_width = min(max(4.4, 1.6 + 0.42 * max(len(p) for p in panels.values())), 10.0)  # inches, ~0.4 per bar
    cols = max(1, min(len(panels), per_row, int(16 // panel_width)))  # at most about 16 inches wide
    n_rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(cols * panel_width, 3.7 * n_rows + 0.5), squeeze=False)
    names = sorted({r["series"] for r in rows})  # a bar colour each
    palette = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colors = {m: palette(i % palette.N) for i, m in enumerate(names)}
    for ax, ((data, features, input_len), panel) in zip(axes.flat, panels.items()):
        horizons = sorted({r["horizon"] for r in panel})
        here = [m for m in names if any(r["series"] == m for r in panel)]
        width = min(0.8 / len(here), 0.3)
        top = 1.3 * max(max(r["mse"] + (r["mse_std"] or 0), r["reference_mse"] or 0) for r in panel)  # room for labels
        for i, model in enumerate(here):
            for r in (r for r in panel if r["series"] == model):
                x = horizons.index(r["horizon"]) + (i - (len(here) - 1) / 2) * width
                std = r["mse_std"] or 0
                ax.bar(x, r["mse"], width * 0.9, color=colors[model], yerr=std or None, capsize=2,
                       error_kw={"lw": 0.8}, label=model)
                if r["reference_mse"] is not None:
                    ax.hlines(r["reference_mse"], x - width / 2, x + width / 2, color="black", lw=2.2, zorder=3,
                              label="published")
                # the value above the bar and its error bar, or above a published line just over them
                anchor = r["mse"] + std
                if r["reference_mse"] is not None and 0 <= r["reference_mse"] - anchor < 0.06 * top:
                    anchor = r["reference_mse"]
                ax.annotate(f"{r['mse']:.3f}", (x, anchor), xytext=(0, 4),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7,
                            rotation=90 if len(here) > 2 else 0)
        ax.set_xticks(range(len(horizons)), [str(h) for h in horizons])
        ax.set_xlim(-0.6, len(horizons) - 0.4)
        ax.set_xlabel("horizon", fontsize=9)
        ax.set_ylabel("test MSE", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.set_title(f"{data} (features {features}, input {input_len})", fontsize=9)
        ax.grid(axis="y", alpha=0.25)
        ax.set_axisbelow(True)
        ax.set_ylim(0, top)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    by_label = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            by_label.setdefault(label, handle)
    labels = [m for m in names if m in by_label] + [x for x in ("published",) if x in by_label]
    # as many legend columns as fit the figure's width (about 4.5 pt per character at size 8)
    entry_points = 30 + 4.5 * max(len(x) for x in labels)
    ncol = max(1, min(len(labels), int(fig.get_figwidth() * 72 // entry_points)))
    legend_rows = math.ceil(len(labels) / ncol)
    fig.set_figheight(fig.get_figheight() + 0.2 * (legend_rows - 1))
    fig.legend([by_label[x] for x in labels], labels, loc="upper center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.25 + 0.2 * legend_rows) / fig.get_figheight()))
    return _save(fig, path)
