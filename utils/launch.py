"""torchrun, with a one-line failure summary instead of a launcher traceback.

`python -m utils.launch <torchrun arguments> run.py ...` is exactly
`torchrun <torchrun arguments> run.py ...` (same parser, same elastic agent, same c10d
rendezvous); only a failed run ends differently: the workers have already printed
what went wrong, so the launcher adds one line and exits with the workers' code.
"""
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run


def launch(torchrun_argv):
    """Run torchrun with these arguments; returns the exit code."""
    config = get_args_parser().parse_args(torchrun_argv)
    try:
        run(config)
    except ChildFailedError as failure:
        codes = sorted({f.exitcode for f in failure.failures.values()})
        print(f"error: {len(failure.failures)} worker(s) failed (exit codes {codes}); "
              "the first message above says why", file=sys.stderr)
        return next((c for c in codes if c > 0), 1)
    return 0


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
