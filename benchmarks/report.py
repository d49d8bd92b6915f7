"""Results table: test MSE / MAE per data set, model and horizon, mean and std over seeds,
beside the published figures; when any record is a probabilistic run's (--loss quantile / studentt / normal),
its WQL, MASE, sMAPE, MSIS and 50 / 80 / 90 % coverage too ('-' in rows that lack them).

    python -m benchmarks.report results/                                  # every results.jsonl under results/
    python -m benchmarks.report a/results.jsonl b/ --format csv --out table.csv
    python -m benchmarks.report results/ --reference ../shared/reference/targets.md --plot mse.png
    python -m benchmarks.report benchmarks/results/reproduce/reproduce_ETTh1-Exchange_DLinear.json   # a reproduce.py run
    python -m benchmarks.report benchmarks/results/reproduce/*.json --into benchmarks/results/reproduce_summary.md --overwrite

Records are the lines run.py appends to `<results_dir>/results.jsonl`. Rows group them by
data set (a `custom` file by its name), features, input length, model, horizon (for
token models the rolled-out test_pred_len and test_seq_len) and training recipe (learning
rate, global batch, --lradj, --des, and --eval_batch_size, --train_drop_last, --embed and a test on a
--test_windows subset when set)
and every other argument that changes what a run trains or scores (--train_epochs, --lr_scaling,
--model_id, the model's shape, ...: TRAJECTORY_ARGS; the ones that set rows apart join --des), so
runs trained or scored differently, or tagged as a variant with --des, never share a row.
A seed counts once: when a seed was run again, its latest record (in file order) replaces
the earlier one. std is the sample standard deviation over seeds (blank for a single seed).
`--is_training 0` records (a checkpoint scored again, e.g. a token model rolled out further) are
rows of their own, never pooled with trained runs, and count one per checkpoint, not per --seed.
Lines that are no record (cut off by a killed run, undecodable bytes) are skipped; one warning counts them.

The published figures come from a targets.md-style markdown file: `## A.` / `## C.`
sections (protocol letter; A has input 96, C input 672), a data set named in the heading
or in a caption line above each table, one row per model and one `MSE / MAE` cell per
horizon. They are shown for features M at the matching input length only. By default they are
read from shared/reference/targets.md beside this repository checkout (../shared/reference/targets.md
from the repository root), when that file exists.

Research tooling, not part of the installed package: run it from a repository checkout.
"""
import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make the repository's packages importable
from utils.arguments import DATA_GROUP, MODEL_GROUP, WINDOW_GROUP, build_parser, group_names  # noqa: E402
from utils.errors import UserError, require  # noqa: E402
from utils.files import atomic_write  # noqa: E402
from utils.plots import pyplot, save_png  # noqa: E402

# benchmarks/ is never installed, so this file always sits in a checkout: the published tables are
# looked for beside the checkout, where the project's shared folder lives.
TARGETS = REPO.parent / "shared" / "reference" / "targets.md"
# Protocol letter = table letter in targets.md; the value is the input length the table assumes.
PROTOCOL_INPUT = {"A": 96, "C": 672}
# Table C's heading names no data set; Timer-XL's Table 12 block it quotes is ETTh1.
SECTION_DEFAULT_DATA = {"C": "ETTh1"}
# Every argument that changes what a run trains or scores, read from run.py's argument groups.
# Left out: what the rows pool over (--seed, --itr) and what only says where or how fast (--root_path,
# loader workers, threads). --is_training keeps evaluations of a checkpoint apart from trained runs.
TRAJECTORY_GROUPS = ("basic", DATA_GROUP, WINDOW_GROUP, "evaluation", MODEL_GROUP, "optimisation",
                     "fine-tuning (OpenLTM)")
NOT_TRAJECTORY = ("seed", "itr", "root_path", "num_workers", "num_threads")
TRAJECTORY_ARGS = tuple(name for group in TRAJECTORY_GROUPS for name in group_names(group)
                        if name not in NOT_TRAJECTORY) + ("sync_bn",)
SYNTHETIC_ONLY = ("synthetic_rows", "synthetic_channels", "synthetic_seed")  # read by --data synthetic alone
DEFAULTS = vars(build_parser().parse_args([]))  # what a record written before an argument existed ran with
KNOWN_DATA = ("ETTh1", "ETTh2", "ETTm1", "ETTm2", "Exchange", "Weather", "ECL", "Electricity", "Traffic", "ILI")


# ------------------------------------------------------------------ published figures
def normalise(name):
    """'Timer-XL (trained 96->96)' and 'TimerXL' -> 'timerxl'; 'Exchange (70/10/20 split)' -> 'exchange'."""
    return re.sub(r"[^a-z0-9]", "", re.sub(r"\(.*?\)", "", name).lower())


def _data_named(text):
    """The known data set a heading or caption line starts with / mentions, if any."""
    words = re.findall(r"[A-Za-z0-9]+", text)
    for word in words:
        for data in KNOWN_DATA:
            if word.lower() == data.lower():
                return data
    return None


def read_published(path):
    """{(protocol, data, model, horizon): (mse, mae)} from tables A and C of targets.md."""
    figures = {}
    section = data = None
    horizons = []
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        heading = re.match(r"^##\s+([A-Z])\.(.*)$", line)
        if heading:
            section = heading.group(1)
            data = _data_named(heading.group(2)) or SECTION_DEFAULT_DATA.get(section)
            horizons = []
            continue
        if line.startswith("#"):
            section = None  # any other heading ends the tables we read
            continue
        if section not in PROTOCOL_INPUT or not line:
            continue
        if not line.startswith("|"):
            caption = line.split()[0]
            if _data_named(caption):  # a caption line such as "Exchange (70/10/20 split)"
                data = _data_named(caption)
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue  # the |---| separator
        if cells[0].lower().startswith("model"):
            horizons = [int(c) if c.isdigit() else None for c in cells[1:]]
            continue
        for horizon, cell in zip(horizons, cells[1:]):
            pair = re.match(r"^([0-9.]+)\s*/\s*([0-9.]+)$", cell)
            if horizon and pair and data:
                figures[(section, normalise(data), normalise(cells[0]), horizon)] = (float(pair[1]), float(pair[2]))
    return figures


# ------------------------------------------------------------------ records
def horizon_of(record):
    """Token models are trained on pred_len and scored on the rolled-out test_pred_len."""
    args = record.get("args", {})
    if args.get("autoregressive") and args.get("test_pred_len"):
        return int(args["test_pred_len"])
    return int(record["pred_len"])


def input_of(record):
    args = record.get("args", {})
    if args.get("autoregressive") and args.get("test_seq_len"):
        return int(args["test_seq_len"])
    return int(args.get("seq_len", 0))


def data_of(record):
    """'ETTh1'; a --data custom file by its name ('exchange_rate' for exchange_rate.txt.gz)."""
    if record.get("grid_data"):  # benchmarks/reproduce.py's own label
        return record["grid_data"]
    data = record.get("data", "?")
    path = record.get("args", {}).get("data_path")
    if data == "custom" and path:
        return Path(path).name.split(".")[0]
    return data


def result_files(paths, name="results.jsonl"):
    """The `name` files named, or found under the folders named, in order."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.rglob(name))
            require(found, f"{path} holds no {name}; point at a --results_dir or a {name} file")
            files += found
        else:
            require(path.is_file(), f"{path} not found; give {name} files or folders that hold them")
            files.append(path)
    return files


def read_records(files):
    """Every record of results.jsonl files; a benchmarks/reproduce.py .json gives the records its table used.
    A line that is no record (cut off by a killed run, undecodable bytes) is skipped; one warning counts them."""
    records, bad = [], []
    for file in files:
        if str(file).endswith(".json"):
            try:
                saved = json.loads(Path(file).read_text())
            except json.JSONDecodeError as exc:
                raise UserError(f"{file} is not JSON ({exc.msg})") from None
            require(isinstance(saved, dict) and isinstance(saved.get("records"), list),
                    f"{file} is not a benchmarks/reproduce.py result (no 'records' list)")
            records += [r for r in saved["records"] if r.get("used", True)]
            continue
        for number, line in enumerate(Path(file).read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            record = _record_in(line)
            if record is None:
                bad.append(f"{file}:{number}")
            else:
                records.append(record)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        print(f"warning: skipped {len(bad)} line(s) that are no run.py result record (cut off by a killed run, "
              f"undecodable bytes, or no model, pred_len, mse and mae): {shown}", file=sys.stderr)
    return records


def _record_in(line):
    """The run.py record a results.jsonl line (bytes) holds, or None."""
    try:
        record = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        return None
    if isinstance(record, dict) and {"model", "mse", "mae", "pred_len"} <= record.keys():
        return record
    return None


def trajectory_of(record):
    """The record's value of every TRAJECTORY_ARGS argument (its default where an older record lacks it)."""
    args = record.get("args", {})
    synthetic = args.get("data", record.get("data")) == "synthetic"
    values = {name: None if name in SYNTHETIC_ONLY and not synthetic else _hashable(args.get(name, DEFAULTS.get(name)))
              for name in TRAJECTORY_ARGS}
    values["is_training"] = bool(values["is_training"])
    return tuple(values.values())


def model_of(record):
    """What a row counts once: a trained run's seed, or the checkpoint an --is_training 0 record scored
    (several --seed values scoring one checkpoint are one model, not several seeds)."""
    args = record.get("args", {})
    if args.get("is_training", 1):
        return record.get("seed")
    return args.get("checkpoint") or str(Path(args.get("checkpoints", "")) / record.get("setting", "") / "checkpoint.pth")


def _hashable(value):
    return tuple(map(_hashable, value)) if isinstance(value, list) else value


# ------------------------------------------------------------------ table
def recipe_of(record):
    """(learning rate, global batch, lr schedule, --des): runs trained differently, or tagged as a
    variant with --des, are rows of their own. 0 / "" where an older record lacks the field.

    Settings that change the figures without changing the tag join it: an explicit --eval_batch_size
    ("Exp, eval batch 1": it leaves most models' figures alone, but not those of a model whose
    forecasts depend on the batch, TimesNet), --train_drop_last ("Exp, train drop_last": other
    training steps), an --embed other than the default timeF ("Exp, embed none": other inputs) and
    a test on a --test_windows subset of the split ("Exp, test 512 of 9000 windows": never taken for
    the full test). They join even when the tag already says so, so a row never mixes runs with and
    without them."""
    args = record.get("args", {})
    des = args.get("des", "")
    notes = []
    if args.get("eval_batch_size"):
        notes.append(f"eval batch {args['eval_batch_size']}")
    if args.get("train_drop_last"):
        notes.append("train drop_last")
    if args.get("embed", "timeF") != "timeF":
        notes.append(f"embed {args['embed']}")
    if record.get("test_windows", 0) < record.get("test_split_windows", 0):
        notes.append(f"test {record['test_windows']} of {record['test_split_windows']} windows")
    for note in notes:
        des = f"{des}, {note}"
    return (args.get("learning_rate", 0.0), args.get("global_batch_size", args.get("batch_size", 0)),
            args.get("lradj", ""), des)


def recipe_label(row):
    """'lr 0.005, batch 32, type1, Exp': a row's recipe as the table shows it ('-' for a missing field)."""
    return f"lr {row['lr']:g}, batch {row['batch'] or '-'}, {row['lradj'] or '-'}, {row['des'] or '-'}"


def summarise(records, published=None):
    """One row per (data, features, input, model, horizon, training recipe, every other trajectory
    argument), sorted; and how many records a later run of the same seed replaced. Runs with
    different recipes stay apart; the arguments that set apart rows that would look alike join --des."""
    published = published or {}
    groups = {}
    for r in records:
        args = r.get("args", {})
        key = (data_of(r), args.get("features", "M"), input_of(r), r["model"], horizon_of(r), *recipe_of(r),
               trajectory_of(r))
        groups.setdefault(key, {})[model_of(r)] = r  # the latest record of a seed (or checkpoint) wins
    replaced = len(records) - sum(len(g) for g in groups.values())
    protocol_of_input = {v: k for k, v in PROTOCOL_INPUT.items()}
    notes = _distinguishing_notes(groups)
    rows = []
    for key, by_seed in groups.items():
        data, features, input_len, model, horizon, lr, batch, lradj, des, _ = key
        des = ", ".join(x for x in (des, notes[key]) if x)
        runs = sorted(by_seed.values(), key=lambda r: (not isinstance(r.get("seed"), int), str(model_of(r)), r.get("seed") if isinstance(r.get("seed"), int) else 0))
        mse, mae = [r["mse"] for r in runs], [r["mae"] for r in runs]
        protocol = protocol_of_input.get(input_len) if features == "M" else None
        figure = _published_figure(published, protocol, data, model, horizon)
        rows.append({
            "data": data, "features": features, "input": input_len, "model": model, "horizon": horizon, "lr": lr,
            "batch": batch or None, "lradj": lradj or None, "des": des or None, "recipe": (lr, batch, lradj, des),
            "seeds": len(runs), "seed_list": [r.get("seed") for r in runs],
            "mse": statistics.fmean(mse), "mse_std": statistics.stdev(mse) if len(mse) > 1 else None,
            "mae": statistics.fmean(mae), "mae_std": statistics.stdev(mae) if len(mae) > 1 else None,
            "reference_protocol": protocol if figure else None,
            "reference_mse": figure[0] if figure else None, "reference_mae": figure[1] if figure else None,
            "mse_vs_reference_pct": 100 * (statistics.fmean(mse) - figure[0]) / figure[0] if figure else None,
            **_probabilistic_means(runs),
        })
    rows.sort(key=lambda r: (r["data"], r["features"], r["input"], r["model"], r["horizon"], *r["recipe"]))
    return rows, replaced


# a probabilistic run's metrics (exp.scoring), shown beside MSE / MAE when any record holds one
PROBABILISTIC = ("wql", "mase", "smape", "msis", "coverage_50", "coverage_80", "coverage_90")


def _probabilistic_means(runs):
    """{metric: mean, metric_std: sample std} over the runs that report it (None where none does)."""
    out = {}
    for name in PROBABILISTIC:
        values = [r[name] for r in runs if isinstance(r.get(name), (int, float))]
        out[name] = statistics.fmean(values) if values else None
        out[f"{name}_std"] = statistics.stdev(values) if len(values) > 1 else None
    return out


def _probabilistic(rows):
    """Whether the table shows the probabilistic columns: some row has one of the metrics."""
    return any(r.get(name) is not None for r in rows for name in PROBABILISTIC)


def _distinguishing_notes(groups):
    """{group key: 'train_epochs 5, model_id b'}: among groups that would share a table row, each one's
    values of the arguments they differ in, where not the default ('' for a group alone in its row).
    Groups with the same notes would hold the same values, so no two rows look alike."""
    variants = {}
    for key in groups:
        variants.setdefault(key[:-1], []).append(key[-1])
    notes = {}
    for row, trajectories in variants.items():
        differ = [i for i in range(len(TRAJECTORY_ARGS)) if len({repr(t[i]) for t in trajectories}) > 1]
        for t in trajectories:
            notes[row + (t,)] = ", ".join(_note(TRAJECTORY_ARGS[i], t[i]) for i in differ
                                          if repr(t[i]) != repr(_default(TRAJECTORY_ARGS[i])))
    return notes


def _default(name):
    return True if name == "is_training" else _hashable(DEFAULTS.get(name))


def _note(name, value):
    return "evaluated checkpoints (--is_training 0)" if name == "is_training" else f"{name} {value}"


def _published_figure(published, protocol, data, model, horizon):
    """The published (mse, mae) for a row, or None. Data names match on their start, so
    'exchange_rate' finds the 'Exchange' table."""
    if protocol is None:
        return None
    ours = normalise(data)
    for (p, pdata, pmodel, phorizon), figure in published.items():
        if p == protocol and pmodel == normalise(model) and phorizon == horizon and ours.startswith(pdata):
            return figure
    return None


def _mean_std(mean, std):
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


MD_COLUMNS = ("data", "features", "input", "model", "horizon", "lr", "batch", "lradj", "des", "MSE", "MAE", "seeds")


PROBABILISTIC_MD = ("WQL", "MASE", "sMAPE", "MSIS", "coverage 50 / 80 / 90 %")


def render_markdown(rows, replaced, reference):
    has_reference = reference is not None
    probabilistic = _probabilistic(rows)
    head = list(MD_COLUMNS)
    if probabilistic:  # beside MSE / MAE, before the seeds
        head[-1:-1] = PROBABILISTIC_MD
    if has_reference:
        head += ["published MSE / MAE", "MSE vs published"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["data"], r["features"], str(r["input"]), r["model"], str(r["horizon"]), f"{r['lr']:g}",
                 str(r["batch"] or "-"), r["lradj"] or "-", r["des"] or "-",
                 _mean_std(r["mse"], r["mse_std"]), _mean_std(r["mae"], r["mae_std"]), str(r["seeds"])]
        if probabilistic:
            cells[-1:-1] = [_mean_std_or_dash(r, name) for name in PROBABILISTIC[:4]] + [_coverages(r)]
        if has_reference:
            if r["reference_mse"] is None:
                cells += ["-", "-"]
            else:
                cells += [f"{r['reference_mse']:.3f} / {r['reference_mae']:.3f} ({r['reference_protocol']})",
                          f"{r['mse_vs_reference_pct']:+.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["MSE / MAE: mean ± sample std over seeds (test set, scaled data)."]
    if probabilistic:
        notes[0] += " WQL, MASE, sMAPE, MSIS (probabilistic runs): likewise; coverage: means."
    if has_reference:
        notes.append(f"Published: {reference}, table A (input 96) or C (input 672), features M only.")
    if replaced:
        notes.append(f"{replaced} record(s) replaced by a later run of the same seed.")
    return "\n".join(lines + [""] + notes) + "\n"


def _mean_std_or_dash(row, name):
    return "-" if row.get(name) is None else _mean_std(row[name], row[f"{name}_std"])


def _coverages(row):
    values = [row.get(f"coverage_{p}") for p in (50, 80, 90)]
    return "-" if all(v is None for v in values) else " / ".join("-" if v is None else f"{v:.3f}" for v in values)


TABLE_HEAD = "| " + " | ".join(MD_COLUMNS[:4]) + " |"  # how render_markdown's table starts
NOTE = re.compile(r"(MSE / MAE: mean|Published: |\d+ record\(s\) replaced)")  # render_markdown's notes


def splice_into(path, table):
    """Text of markdown file `path` with its results table (and the notes under it) replaced by
    `table`, the prose around it kept: a results document stays current with one command."""
    require(Path(path).is_file(), f"--into {path} not found; write a first table with --out and add your prose to it")
    lines = Path(path).read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(TABLE_HEAD)]
    require(len(starts) == 1, f"--into {path} holds {len(starts)} results tables (lines starting "
                              f"'{TABLE_HEAD}'), not one; write a first table with --out and paste it in")
    end = starts[0]
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    if end + 1 < len(lines) and not lines[end] and NOTE.match(lines[end + 1]):  # notes follow a blank line
        end += 1
        while end < len(lines) and NOTE.match(lines[end]):
            end += 1
    return "\n".join(lines[:starts[0]] + table.rstrip("\n").split("\n") + lines[end:]) + "\n"


CSV_FIELDS = ("data", "features", "input", "model", "horizon", "lr", "batch", "lradj", "des", "seeds", "mse", "mse_std", "mae", "mae_std",
              "reference_protocol", "reference_mse", "reference_mae", "mse_vs_reference_pct")


def render_csv(rows):
    fields = list(CSV_FIELDS)
    if _probabilistic(rows):  # after mae_std
        at = fields.index("mae_std") + 1
        fields[at:at] = [f for name in PROBABILISTIC for f in (name, f"{name}_std")]
    out = io.StringIO()
    writer = csv.DictWriter(out, fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r[k] is None else r[k] for k in fields})
    return out.getvalue()


# ------------------------------------------------------------------ picture
def plot_report(path, rows, per_row=3):
    """Bar chart of test MSE per model and horizon, one panel per (data set, features, input).

    rows: summarise's dicts (data, features, input, model, recipe, horizon, mse,
    mse_std: None for one seed, reference_mse: None without a published figure). Error bars are
    the std over seeds; a black line over a bar is the published figure.
    """
    plt = pyplot()
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
    return save_png(fig, path)


def _refuse_to_replace(opts):
    """None, or the one line saying which existing file this command would replace without --overwrite."""
    if opts.overwrite:
        return None
    if opts.into and Path(opts.into).is_file():
        return f"--into {opts.into} would rewrite that file in place; add --overwrite to do so, or --out a new file"
    for flag, path in (("--out", opts.out), ("--plot", opts.plot)):
        if path and Path(path).exists():
            return f"{flag} {path} exists; add --overwrite to replace it, or name a new file"
    return None


def _write_text(path, text):
    atomic_write(path, lambda f: f.write(text), binary=False)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results.jsonl files, or folders searched for them")
    parser.add_argument("--format", choices=("md", "csv"), default="md")
    parser.add_argument("--reference", default=str(TARGETS) if TARGETS.exists() else "",
                        help="markdown file with the published tables (default: shared/reference/targets.md beside "
                             f"this repository checkout, {TARGETS}, when it exists; '' for none)")
    parser.add_argument("--plot", default=None, help="also draw a bar chart of MSE per model and horizon (PNG)")
    parser.add_argument("--out", default=None, help="write the table here instead of printing it")
    parser.add_argument("--into", default=None,
                        help="markdown file whose results table (and its notes) is replaced, the prose around it kept "
                             "(needs --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --into rewrite its file in place and --out / --plot replace an existing file")
    opts = parser.parse_args(argv)
    try:
        refusal = _refuse_to_replace(opts)
        require(refusal is None, refusal)
        records = read_records(result_files(opts.results))
        require(records, "no records in " + ", ".join(opts.results))
        reference = None
        if opts.reference:
            require(Path(opts.reference).is_file(), f"--reference {opts.reference} not found; give the markdown "
                                                    "file with the published tables, or --reference '' for none")
            reference = opts.reference
        rows, replaced = summarise(records, read_published(reference) if reference else {})
        table = render_csv(rows) if opts.format == "csv" else render_markdown(rows, replaced, reference)
        if opts.into:
            require(opts.format == "md" and not opts.out, "--into replaces the table in a markdown file: "
                                                          "give it without --format csv and without --out")
            _write_text(opts.into, splice_into(opts.into, table))
            print(f"updated the table in {opts.into} ({len(rows)} rows from {len(records)} records)")
        elif opts.out:
            _write_text(opts.out, table)
            print(f"wrote {opts.out} ({len(rows)} rows from {len(records)} records)")
        else:
            sys.stdout.write(table)
        if opts.plot:
            plot_report(opts.plot, rows)
            print(f"wrote {opts.plot}")
    except UserError as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0

if __name__ == "__main__":
    sys.exit(main())
