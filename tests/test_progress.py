"""Progress output: a bar on a terminal, plain periodic lines in logs, nothing with --quiet."""
import io
import re

from helpers import assert_ok, records, run_cli
from utils.progress import EpochProgress, progress_mode


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_without_a_terminal_at_each_quarter():
    stream = io.StringIO()
    assert progress_mode(stream=stream) == "lines"
    progress = EpochProgress(3, 40, "lines", stream=stream, every_s=1e9)
    for _ in range(40):
        progress.update(2.0, 4, 32)  # loss sum 2 over 4 scored elements: mean 0.5
    progress.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0].strip() for line in lines] == ["epoch 3: 10/40 steps", "epoch 3: 20/40 steps",
                                                              "epoch 3: 30/40 steps"]
    assert all("loss 0.500000" in line and "samples/s" in line and "eta" in line for line in lines)
    assert "\r" not in stream.getvalue()  # no bar redraws in a log file


def test_a_progress_line_is_one_write_with_its_newline():
    """print() wrote a line and its newline apart: a SIGINT between them glued run.py's one error line onto
    the progress line (seen as `eta 0serror: stopped by SIGINT`)."""
    class Writes(io.StringIO):
        def __init__(self):
            super().__init__()
            self.writes = []

        def write(self, text):
            self.writes.append(text)
            return super().write(text)

    stream = Writes()
    progress = EpochProgress(1, 8, "lines", stream=stream, every_s=1e9)
    for _ in range(8):
        progress.update(1.0, 2, 2)
    assert len(stream.writes) == 3 and all(w.endswith("\n") and w.count("\n") == 1 for w in stream.writes)


def test_bar_on_a_terminal_and_nothing_when_quiet():
    terminal = _Terminal()
    assert progress_mode(stream=terminal) == "bar"
    assert progress_mode(quiet=True, stream=terminal) is None
    progress = EpochProgress(1, 5, "bar", stream=terminal)
    for _ in range(5):
        progress.update(1.0, 1, 8)
    progress.close()
    drawn = terminal.getvalue()
    assert "epoch 1:" in drawn and "/5 [" in drawn and "\r" in drawn  # a tqdm bar, redrawn in place


def test_run_logs_epoch_summaries_and_quiet_keeps_only_the_result(tmp_path):
    argv = ["--train_epochs", 2, "--synthetic_rows", 1500]
    proc = run_cli(tmp_path, *argv)
    assert_ok(proc)
    progress = [line for line in proc.stderr.splitlines() if line.strip().startswith("epoch 1:")]
    assert progress and "steps, loss" in progress[0]  # plain lines: the test's output is not a terminal
    summary = [line for line in proc.stdout.splitlines() if line.startswith("epoch 2/2:")]
    assert summary and "samples/s" in summary[0] and "best vali" in summary[0] and " lr " in summary[0]
    state_bytes = records(tmp_path)[-1]["optimizer_state_bytes"]  # Adam: two moments per parameter
    assert f"optimizer state per rank: {state_bytes[0] / 2**20:.2f} MiB" in proc.stdout

    quiet = run_cli(tmp_path, *argv, "--quiet")
    assert_ok(quiet)
    assert [line.split(":")[0].split(" ")[0] for line in quiet.stdout.splitlines()] == ["test"]
    assert "steps, loss" not in quiet.stderr


def test_the_logged_rate_is_every_process_together(tmp_path):
    proc = run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500, "--ddp", nproc=2)
    assert_ok(proc)
    record = records(tmp_path)[-1]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("epoch 1/1:"))
    rate = float(re.search(r" (\d+) samples/s", line).group(1))
    # both ranks' windows over the training time, which is shorter than the epoch's (that adds evaluation)
    assert rate >= 0.9 * record["train_windows"] / record["history"][0]["seconds"], line


def test_progress_counts_optimizer_steps_under_accumulation(tmp_path):
    proc = run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500, "--batch_size", 16, "--accumulation_steps", 2)
    assert_ok(proc)
    batches = -(-records(tmp_path)[-1]["train_windows"] // 16)
    totals = {line.split("/")[1].split()[0] for line in proc.stderr.splitlines() if line.strip().startswith("epoch 1:")}
    assert totals == {str(-(-batches // 2))}, proc.stderr[-2000:]
