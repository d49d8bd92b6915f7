"""Results table: test MSE / MAE per data set, model and horizon, mean and std over seeds,
beside the published figures.

    python -m utils.report results/                                  # every results.jsonl under results/
    python -m utils.report a/results.jsonl b/ --format csv --out table.csv
    python -m utils.report results/ --reference ../shared/reference/targets.md --plot mse.png
    python -m utils.report benchmarks/results/reproduce/reproduce_ETTh1-Exchange_DLinear.json   # a reproduce.py run
    python -m utils.report benchmarks/results/reproduce/*.json --into benchmarks/results/reproduce_summary.md

Records are the lines run.py appends to `<results_dir>/results.jsonl`. Rows group them by
data set (a `custom` file by its name), features, input length, model, horizon (for
token models the rolled-out test_pred_len and test_seq_len) and training recipe (learning
rate, global batch, --lradj, --des, and --eval_batch_size, --train_drop_last and --embed when set),
so runs trained or scored differently, or tagged as a variant with --des, never share a row.
A seed counts once: when a seed was run again, its latest record (in file order) replaces
the earlier one. std is the sample standard deviation over seeds (blank for a single seed).

The published figures come from a targets.md-style markdown file: `## A.` / `## C.`
sections (protocol letter; A has input 96, C input 672), a data set named in the heading
or in a caption line above each table, one row per model and one `MSE / MAE` cell per
horizon. They are shown for features M at the matching input length only.
"""
import argparse
import csv
import io
import json
import re
import statistics
import sys
from pathlib import Path

from utils.errors import UserError, require

TARGETS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "targets.md"
# Protocol letter = table letter in targets.md; the value is the input length the table assumes.
PROTOCOL_INPUT = {"A": 96, "C": 672}
# Table C's heading names no data set; Timer-XL's Table 12 block it quotes is ETTh1.
SECTION_DEFAULT_DATA = {"C": "ETTh1"}
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
    """Every record of results.jsonl files; a benchmarks/reproduce.py .json gives the records its table used."""
    records = []
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
        for number, line in enumerate(Path(file).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{file}:{number} is not a JSON record ({exc.msg}); was the file cut off?") from None
            require(isinstance(record, dict) and {"model", "mse", "mae", "pred_len"} <= record.keys(),
                    f"{file}:{number} is not a run.py result record (needs model, pred_len, mse, mae)")
            records.append(record)
    return records


# ------------------------------------------------------------------ table
def recipe_of(record):
    """(learning rate, global batch, lr schedule, --des): runs trained differently, or tagged as a
    variant with --des, are rows of their own. 0 / "" where an older record lacks the field.

    Settings that change the figures without changing the tag join it: an explicit --eval_batch_size
    ("Exp, eval batch 1": it leaves most models' figures alone, but not those of a model whose
    forecasts depend on the batch, TimesNet), --train_drop_last ("Exp, train drop_last": other
    training steps) and an --embed other than the default timeF ("Exp, embed none": other inputs).
    They join even when the tag already says so, so a row never mixes runs with and without them."""
    args = record.get("args", {})
    des = args.get("des", "")
    notes = []
    if args.get("eval_batch_size"):
        notes.append(f"eval batch {args['eval_batch_size']}")
    if args.get("train_drop_last"):
        notes.append("train drop_last")
    if args.get("embed", "timeF") != "timeF":
        notes.append(f"embed {args['embed']}")
    for note in notes:
        des = f"{des}, {note}"
    return (args.get("learning_rate", 0.0), args.get("global_batch_size", args.get("batch_size", 0)),
            args.get("lradj", ""), des)


def recipe_label(row):
    """'lr 0.005, batch 32, type1, Exp': a row's recipe as the table shows it ('-' for a missing field)."""
    return f"lr {row['lr']:g}, batch {row['batch'] or '-'}, {row['lradj'] or '-'}, {row['des'] or '-'}"


def summarise(records, published=None):
    """One row per (data, features, input, model, horizon, training recipe), sorted; and how many
    records a later run of the same seed replaced. Runs with different recipes stay apart."""
    published = published or {}
    groups = {}
    for r in records:
        args = r.get("args", {})
        key = (data_of(r), args.get("features", "M"), input_of(r), r["model"], horizon_of(r), *recipe_of(r))
        groups.setdefault(key, {})[r.get("seed")] = r  # the latest record of a seed wins
    replaced = len(records) - sum(len(g) for g in groups.values())
    protocol_of_input = {v: k for k, v in PROTOCOL_INPUT.items()}
    rows = []
    for (data, features, input_len, model, horizon, lr, batch, lradj, des), by_seed in sorted(groups.items()):
        runs = [by_seed[s] for s in sorted(by_seed, key=lambda s: (not isinstance(s, int), s if isinstance(s, int) else 0, str(s)))]
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
        })
    return rows, replaced


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


def render_markdown(rows, replaced, reference):
    has_reference = reference is not None
    head = list(MD_COLUMNS)
    if has_reference:
        head += ["published MSE / MAE", "MSE vs published"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["data"], r["features"], str(r["input"]), r["model"], str(r["horizon"]), f"{r['lr']:g}",
                 str(r["batch"] or "-"), r["lradj"] or "-", r["des"] or "-",
                 _mean_std(r["mse"], r["mse_std"]), _mean_std(r["mae"], r["mae_std"]), str(r["seeds"])]
        if has_reference:
            if r["reference_mse"] is None:
                cells += ["-", "-"]
            else:
                cells += [f"{r['reference_mse']:.3f} / {r['reference_mae']:.3f} ({r['reference_protocol']})",
                          f"{r['mse_vs_reference_pct']:+.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["MSE / MAE: mean ± sample std over seeds (test set, scaled data)."]
    if has_reference:
        notes.append(f"Published: {reference}, table A (input 96) or C (input 672), features M only.")
    if replaced:
        notes.append(f"{replaced} record(s) replaced by a later run of the same seed.")
    return "\n".join(lines + [""] + notes) + "\n"


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
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r[k] is None else r[k] for k in CSV_FIELDS})
    return out.getvalue()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m utils.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results.jsonl files, or folders searched for them")
    parser.add_argument("--format", choices=("md", "csv"), default="md")
    parser.add_argument("--reference", default=str(TARGETS) if TARGETS.exists() else "",
                        help="markdown file with the published tables (default: ../shared/reference/targets.md "
                             "when it exists; '' for none)")
    parser.add_argument("--plot", default=None, help="also draw a bar chart of MSE per model and horizon (PNG)")
    parser.add_argument("--out", default=None, help="write the table here instead of printing it")
    parser.add_argument("--into", default=None,
                        help="markdown file whose results table (and its notes) is replaced, the prose around it kept")
    opts = parser.parse_args(argv)
    try:
        records = read_records(result_files(opts.results))
        require(records, "no records in " + ", ".join(opts.results))
        reference = None
        if opts.reference:
            require(Path(opts.reference).is_file(), f"--reference {opts.reference} not found")
            reference = opts.reference
        rows, replaced = summarise(records, read_published(reference) if reference else {})
        table = render_csv(rows) if opts.format == "csv" else render_markdown(rows, replaced, reference)
        if opts.into:
            require(opts.format == "md" and not opts.out, "--into replaces the table in a markdown file: "
                                                          "give it without --format csv and without --out")
            Path(opts.into).write_text(splice_into(opts.into, table))
            print(f"updated the table in {opts.into} ({len(rows)} rows from {len(records)} records)")
        elif opts.out:
            Path(opts.out).write_text(table)
            print(f"wrote {opts.out} ({len(rows)} rows from {len(records)} records)")
        else:
            sys.stdout.write(table)
        if opts.plot:
            from utils.plots import plot_report

            plot_report(opts.plot, rows)
            print(f"wrote {opts.plot}")
    except UserError as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
