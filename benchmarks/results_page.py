"""Measured results as data, and the one page that shows them all.

A harness or lab script writes its result as a markdown table (`--out`). Stored, a result is data: each table a
CSV file, and a JSON file holding the title, the text around the tables and which CSV goes where, so the same
markdown comes back from them character for character. One page, benchmarks/results/README.md, is generated from
every stored result under benchmarks/results/ and lab/results/, and lists the results kept as prose notes
(records written by hand, or read back by the script that wrote them) with their titles.

    python -m benchmarks.results_page add lab/results/bench_io.md    # -> bench_io.json + bench_io.csv, page rewritten
    python -m benchmarks.results_page add --replace FILE.md           # a rerun, over the stored result of its name
    python -m benchmarks.results_page write                          # the page from the data
    python -m benchmarks.results_page check                          # exit 1 if the page is not the data's
"""
import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = (REPO / "benchmarks" / "results", REPO / "lab" / "results")
PAGE = REPO / "benchmarks" / "results" / "README.md"
FORMAT = "markdown result, tables as CSV"


def is_row(line):
    return line.startswith("|") and line.rstrip().endswith("|")


def split_row(line):
    """The cells of a markdown table row, `\\|` kept inside a cell."""
    cells, cell, escaped = [], "", False
    for char in line.strip()[1:-1]:
        if char == "|" and not escaped:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
        escaped = char == "\\" and not escaped
    return [*cells, cell.strip()]


def join_row(cells, tight=False):
    """A markdown row; `tight`: an empty cell is written `| |`, not `|  |` (some tables were written so)."""
    return "|" + "|".join(f" {cell} " if cell or not tight else " " for cell in cells) + "|"


def is_rule(line):
    return is_row(line) and all(set(cell) <= set("-:") and cell for cell in split_row(line))


def parse(text):
    """[{"text": ...} | {"rows": [[header...], [cells...], ...], "rule": "|---|"}, ...] from a markdown text."""
    lines, blocks, prose = text.split("\n"), [], []
    i = 0
    while i < len(lines):
        if is_row(lines[i]) and i + 1 < len(lines) and is_rule(lines[i + 1]):
            blocks.append({"text": "\n".join(prose)})
            prose = []
            rows, rule, start = [split_row(lines[i])], lines[i + 1], i
            i += 2
            while i < len(lines) and is_row(lines[i]):
                rows.append(split_row(lines[i]))
                i += 1
            tight = any("| |" in line for line in lines[start:i])
            blocks.append({"rows": rows, "rule": rule, **({"tight": True} if tight else {})})
        else:
            prose.append(lines[i])
            i += 1
    blocks.append({"text": "\n".join(prose)})
    return blocks


def render(blocks, tables):
    """The markdown text back from parse's blocks, each table's rows read from `tables[name]`."""
    parts = []
    for block in blocks:
        if "text" in block:
            parts.append(block["text"])
        else:
            header, *body = tables[block["table"]]
            tight = block.get("tight", False)
            parts.append("\n".join([join_row(header, tight), block["rule"], *(join_row(row, tight) for row in body)]))
    return "\n".join(parts)


def csv_text(rows):
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def read_csv(path):
    return list(csv.reader(io.StringIO(path.read_text())))


def add(markdown, replace=False):
    """Store `markdown` (a result file) as NAME.json and NAME.csv (NAME_2.csv, ... for further tables) beside it,
    checked to give the same text back, and remove it. A result stored under NAME already is kept unless
    `replace` (it is committed: a rerun replaces it on purpose)."""
    markdown = Path(markdown)
    if not markdown.is_file():
        raise SystemExit(f"{markdown} not found: give the markdown file a harness wrote")
    old = markdown.parent / f"{markdown.stem}.json"
    if replace and old.exists() and json.loads(old.read_text()).get("format") == FORMAT:
        for block in json.loads(old.read_text())["blocks"]:
            if "table" in block:
                (markdown.parent / block["table"]).unlink(missing_ok=True)
        old.unlink()
    text = markdown.read_text()
    blocks, tables = parse(text), {}
    for block in blocks:
        if "rows" in block:
            name = f"{markdown.stem}.csv" if not tables else f"{markdown.stem}_{len(tables) + 1}.csv"
            tables[name] = block.pop("rows")
            block["table"] = name
    if not tables:
        raise SystemExit(f"{markdown} holds no table: keep it as a note")
    taken = [markdown.parent / name for name in (f"{markdown.stem}.json", *tables) if (markdown.parent / name).exists()]
    if taken:
        raise SystemExit(f"{markdown}: {taken[0]} exists; pass --replace to store this result over the stored one "
                         "(or rename the file)")
    widths = {name: {len(row) for row in rows} for name, rows in tables.items()}
    if any(len(found) != 1 for found in widths.values()):
        raise SystemExit(f"{markdown}: a table whose rows differ in length cannot be a CSV file; keep it as a note")
    if render(blocks, tables) != text:
        raise SystemExit(f"{markdown}: its text does not come back from the data; keep it as a note")
    for name, rows in tables.items():
        (markdown.parent / name).write_text(csv_text(rows))
    record = {"format": FORMAT, "title": title_of(text), "blocks": blocks}
    (markdown.parent / f"{markdown.stem}.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    markdown.unlink()


def title_of(text):
    first = text.split("\n", 1)[0]
    return first.lstrip("#").strip() if first.startswith("#") else ""


def stored(folder):
    """The results stored as data under `folder`: [(json path, record)]."""
    found = []
    for path in sorted(folder.rglob("*.json")):
        record = json.loads(path.read_text()) if path.stat().st_size < 1_000_000 else None
        if isinstance(record, dict) and record.get("format") == FORMAT:
            found.append((path, record))
    return found


def notes(folder):
    """The results kept as markdown notes under `folder`: every .md but the page."""
    return [path for path in sorted(folder.rglob("*.md")) if path != PAGE]


def shifted(text, levels=2):
    """The markdown with every heading `levels` deeper (the page's sections hold them)."""
    return "\n".join("#" * levels + line if line.startswith("#") else line for line in text.split("\n"))


def link(path):
    """`path` relative to the page, as a markdown link target."""
    return Path(os.path.relpath(path, PAGE.parent)).as_posix()


def records(folder):
    """Folders of JSON run records under `folder` that are not stored results: {folder: count}."""
    counts = {}
    for path in sorted(folder.rglob("*.json")):
        if path.parent != folder and not any(path == found for found, _ in stored(path.parent)):
            counts[path.parent] = counts.get(path.parent, 0) + 1
    return counts


def page():
    lines = ["# Results", "",
             "Generated by `python -m benchmarks.results_page write` from the data beside it and in "
             "[lab/results](../../lab/results); do not edit. Each result's tables are CSV files beside its JSON "
             "record. The harnesses: [benchmarks/README](../README.md); the lab's cross-checks: "
             "[lab/README](../../lab/README.md).", ""]
    for folder in FOLDERS:
        where = folder.relative_to(REPO).as_posix()
        lines += [f"## {where}", ""]
        for path, record in stored(folder):
            tables = {block["table"]: read_csv(path.parent / block["table"])
                      for block in record["blocks"] if "table" in block}
            name = path.relative_to(folder).with_suffix("").as_posix()
            data = ", ".join(f"[{table}]({link(path.parent / table)})" for table in tables)
            text = render(record["blocks"], tables).strip("\n")
            if text.startswith("#"):
                text = text.split("\n", 1)[1] if "\n" in text else ""
            lines += [f"### {record['title'] or name}", "", f"`{name}`, data: {data}", "",
                      shifted(text.strip("\n"), 3), ""]
        runs = records(folder)
        if runs:
            lines += ["### Run records", ""]
            lines += [f"- [{path.relative_to(folder).as_posix()}/]({link(path)}): {count} JSON records of runs"
                      for path, count in runs.items()]
            lines.append("")
        kept = notes(folder)
        if kept:
            lines += ["### Notes", "", "Records kept as prose (written by hand, or read back by the script that "
                      "wrote them):", ""]
            for path in kept:
                title = title_of(path.read_text()) or path.stem
                lines.append(f"- [{path.relative_to(folder).as_posix()}]({link(path)}): {title}")
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    adding = sub.add_parser("add", help="store markdown results as CSV + JSON, then rewrite the page")
    adding.add_argument("files", nargs="+")
    adding.add_argument("--replace", action="store_true", help="store over a result of the same name")
    sub.add_parser("write", help="rewrite the page from the data")
    sub.add_parser("check", help="exit 1 if the page is not what the data gives")
    args = parser.parse_args(argv)
    if args.command == "add":
        for file in args.files:
            add(file, args.replace)
    if args.command == "check":
        if not PAGE.exists() or PAGE.read_text() != page():
            print(f"{PAGE.relative_to(REPO)} is not the data's: python -m benchmarks.results_page write",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
