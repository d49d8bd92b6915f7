"""The bad-input catalogue (tests/bad_inputs.py): every documented bad input ends run.py on 1 and 2
processes with exit code 2, one `error:` line, no traceback, promptly, and with no file touched; the
catalogue is the one docs/reliability.md and the README describe; through the real launchers (fresh
interpreters, torchrun's agent) a bad input ends the same way."""
import re
import time

import pytest

from bad_inputs import BY_NAME, DOCUMENTED, cases, run_probe
from helpers import REPO, assert_one_error_line, output_args, run_cli


@pytest.mark.parametrize("probe, processes", cases(), ids=[f"{p.name}-{n}p" for p, n in cases()])
def test_bad_input_is_one_line_and_touches_nothing(tmp_path, probe, processes):
    outcome = run_probe(probe, processes, tmp_path)
    assert not outcome.problems(), outcome.report()


def _catalogue_rows():
    text = (REPO / "docs" / "reliability.md").read_text()
    table = text.split("## The bad-input catalogue", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    return rows[1:]  # after the header row


def test_the_catalogue_is_the_documented_one():
    assert _catalogue_rows() == [probe.name for probe in DOCUMENTED]
    readme = (REPO / "README.md").read_text()
    count = re.search(r"(\d+) bad inputs, (\d+) runs \(1 and 2 processes\): \2 one-line errors, 0 tracebacks, "
                      r"0 hangs, 0 files touched", readme)
    assert count, "README's bad-input count"
    assert (int(count.group(1)), int(count.group(2))) == (len(DOCUMENTED), sum(len(p.processes) for p in DOCUMENTED))


# Through the launchers users type: a parse error, a data error, a model that cannot be built (after the
# process group), an unwritable folder (decided on rank 0), each on `python run.py --ddp` (torchrun's agent,
# fresh worker interpreters): the worker's line alone, no summary from the agent, none of torchrun's log lines.
THROUGH_THE_LAUNCHER = ["negative learning rate", "missing file", "heads do not divide d_model", "unwritable results_dir"]


@pytest.mark.parametrize("name", THROUGH_THE_LAUNCHER)
def test_bad_input_through_the_real_launcher(tmp_path, name):
    probe = BY_NAME[name]
    argv = probe.argv(tmp_path)
    outputs = [] if any(str(a) in ("--checkpoints", "--results_dir") for a in argv) else output_args(tmp_path)
    sentinel = tmp_path / "results" / "results.jsonl"
    sentinel.parent.mkdir()
    sentinel.write_text('{"earlier": "result"}\n')
    started = time.time()
    proc = run_cli(tmp_path, *argv, *outputs, "--ddp", "--nproc_per_node", 2, outputs=False, timeout=90, fresh=True)
    assert_one_error_line(proc, probe.message)
    assert time.time() - started < 60  # three interpreters start: about 10 s on 2 idle cores
    assert sentinel.read_text() == '{"earlier": "result"}\n'

