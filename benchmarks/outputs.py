"""What the benchmarks that write a results table share: where it goes, refusing to replace a committed
one by accident, and a scratch folder emptied first."""
import os
import shutil
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def add_output_arguments(parser, table, workdir, results=RESULTS):
    """--out (default `results`/<table>: benchmarks/results/, or lab/results/ for a lab script), --overwrite and,
    unless `workdir` is None, --workdir (default `workdir`)."""
    if workdir is not None:
        parser.add_argument("--workdir", default=workdir, help="scratch folder, emptied first and removed after")
    parser.add_argument("--out", default=str(Path(results) / table))
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def parse_with_outputs(parser):
    """The parsed options and an empty scratch folder; a parser error if --out exists without --overwrite."""
    options = parser.parse_args()
    if os.path.exists(options.out) and not options.overwrite:
        parser.error(f"{options.out} exists; pass --overwrite to replace it")
    work = Path(options.workdir)
    shutil.rmtree(work, ignore_errors=True)
    return options, work
