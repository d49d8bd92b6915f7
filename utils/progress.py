"""Training and evaluation progress on rank 0: a tqdm bar on a terminal, periodic plain lines in logs,
or nothing.

The loss shown is read from the device only when something is about to be displayed, so
progress adds no host sync to ordinary steps. An evaluation shows nothing until it has run for a
few seconds, so short runs print no progress for their validations and tests.
"""
import logging
import os
import sys
import time

from utils import distributed

RESULT = 25  # log level of the final result lines: above INFO, so --quiet keeps only them
logging.addLevelName(RESULT, "RESULT")

PLAIN_EVERY_S = 30.0  # without a terminal: one line at most this often (and at 25/50/75 %)
EVALUATION_QUIET_S = 5.0  # an evaluation shows progress once it has run this long


def progress_mode(quiet=False, stream=None):
    """'bar' on a terminal, 'lines' when output goes to a file or pipe, None when quiet or not rank 0."""
    if quiet or not distributed.is_main():
        return None
    stream = stream or sys.stderr
    return "bar" if stream.isatty() else "lines"


class EpochProgress:
    """`update(loss_sum, n_scored, samples)` after each optimizer step; `close()` at the end of the epoch.

    loss_sum / n_scored is the step's mean loss; loss_sum may be a device tensor (read only when shown).
    """

    def __init__(self, epoch, total_steps, mode, stream=None, every_s=PLAIN_EVERY_S, done=0):
        """`done`: steps of this epoch taken before a mid-epoch resume."""
        self.epoch, self.total, self.mode = epoch, total_steps, mode
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.steps, self.samples, self._first = done, 0, done
        self._quarters_done = 4 * done // max(total_steps, 1)
        self.started = self._last_print = time.perf_counter()
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, desc=f"epoch {epoch}", unit="step", file=self.stream,
                             dynamic_ncols=True, leave=False, initial=done)

    def update(self, loss_sum, n_scored, samples):
        self.steps += 1
        self.samples += samples
        if self.mode == "bar":
            self._bar.update(1)
            if self._bar.n == self._bar.last_print_n:  # tqdm just redrew: only then read the loss
                self._bar.set_postfix(loss=f"{float(loss_sum) / n_scored:.4f}", refresh=False)
        elif self.mode == "lines" and self._line_due():
            self._print_line(float(loss_sum) / n_scored)

    def _line_due(self):
        now = time.perf_counter()
        quarter = 4 * self.steps // max(self.total, 1)
        if quarter > self._quarters_done and self.steps < self.total:
            self._quarters_done = quarter
            return True
        return now - self._last_print >= self.every_s

    def _print_line(self, loss):
        elapsed = time.perf_counter() - self.started
        rate = (self.steps - self._first) / elapsed if elapsed else 0.0
        eta = (self.total - self.steps) / rate if rate else float("nan")
        # one write, newline included: print() writes the line and its end apart, and a SIGINT between
        # the two would glue run.py's `error: stopped by SIGINT` line onto this one
        self.stream.write(f"  epoch {self.epoch}: {self.steps}/{self.total} steps, loss {loss:.6f}, "
                          f"{self.samples / elapsed:.0f} samples/s, eta {eta:.0f}s\n")
        self.stream.flush()
        self._last_print = time.perf_counter()

    def close(self):
        if self._bar is not None:
            self._bar.close()

    @property
    def samples_per_second(self):
        elapsed = time.perf_counter() - self.started
        return self.samples / elapsed if elapsed else 0.0


class EvaluationProgress:
    """`update()` after each batch of an evaluation (`stage`: val or test) of `total` batches; `close()`
    at its end. Nothing is shown for its first `quiet_s` seconds (default EVALUATION_QUIET_S, or the
    private TSL_EVALUATION_QUIET_S environment variable, which tests lower); then a bar on a terminal,
    or a line every `every_s` seconds in logs. The batches counted are this rank's (rank 0's)."""

    def __init__(self, stage, total, mode, stream=None, quiet_s=None, every_s=PLAIN_EVERY_S):
        if quiet_s is None:
            quiet_s = float(os.environ.get("TSL_EVALUATION_QUIET_S", EVALUATION_QUIET_S))
        self.stage, self.total, self.mode = stage, total, mode
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.done = 0
        self.started = time.perf_counter()
        self._next_line = self.started + quiet_s
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=stage, unit="batch", file=self.stream, dynamic_ncols=True,
                             leave=False, delay=quiet_s)

    def update(self):
        self.done += 1
        if self.mode == "bar":
            self._bar.update(1)
        elif self.mode == "lines" and time.perf_counter() >= self._next_line:
            elapsed = time.perf_counter() - self.started
            eta = (self.total - self.done) * elapsed / self.done
            # one write, newline included (see EpochProgress._print_line)
            self.stream.write(f"  {self.stage}: {self.done}/{self.total} batches, {self.done / elapsed:.1f} "
                              f"batches/s, eta {eta:.0f}s\n")
            self.stream.flush()
            self._next_line = time.perf_counter() + self.every_s

    def close(self):
        if self._bar is not None:
            self._bar.close()
