"""run.py has malloc keep the memory the process frees (utils.tools.keep_freed_memory, --keep_freed_memory):
a tensor that one training step frees comes back the next step without the kernel zeroing fresh pages for
it, a page fault per 4 KiB (about 31 000 a step for TimeMixer at its ETTh1 settings before)."""
import platform
import subprocess
import sys

import pytest

from helpers import REPO, output_args, subprocess_env

# The resident memory (MiB) before, during and after a 30 MiB tensor, in a fresh interpreter after `setup`.
CHILD = """
import sys
import torch
sys.path.insert(0, {repo!r})
{setup}
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
before = resident()
block = torch.ones(30 << 18)
during = resident()
del block
print(before, during, resident())
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc (Linux)")
@pytest.mark.parametrize("keep", [False, True])
def test_a_freed_block_stays_for_reuse_only_when_kept(keep):
    """glibc's defaults hand a 30 MiB block back to the kernel on free (so its next use faults in fresh
    pages); kept, it stays resident for the next allocation."""
    setup = "from utils.tools import keep_freed_memory\nassert keep_freed_memory()" if keep else ""
    proc = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO), setup=setup)], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, during, after = map(int, proc.stdout.split())
    assert during - before >= 28
    if keep:
        assert after >= during - 2
    else:
        assert after <= before + 2


@pytest.mark.parametrize("flag, calls", [([], 1), (["--keep_freed_memory", "false"], 0)])
def test_run_py_keeps_freed_memory_unless_told_not_to(flag, calls, tmp_path, monkeypatch):
    import run

    called = []
    monkeypatch.setattr(run, "keep_freed_memory", lambda: called.append(True))
    # run.main gives the "tsl" logger its own handler and stops propagation: later tests read the log via caplog
    monkeypatch.setattr(run, "configure_logging", lambda quiet=False: None)
    argv = ["--train_epochs", 1, "--synthetic_rows", 1500, "--no_plots", "--quiet", *output_args(tmp_path), *flag]
    assert run.main(list(map(str, argv))) == 0
    assert len(called) == calls
