"""torchrun, with a one-line failure summary instead of a launcher traceback.

`python -m utils.launch <torchrun arguments> run.py ...` is exactly
`torchrun <torchrun arguments> run.py ...` (same parser, same elastic agent, same c10d
rendezvous); only a run's end differs. A worker's user error ends the job at once, whatever
--max_restarts, with exit code 2 and the worker's line alone. A worker that failed without
saying why (killed, or a traceback) gets one line from the launcher, which exits with the
workers' code. A rendezvous that fails before any worker starts (a node missing,
MASTER_ADDR unreachable, the port taken) ends with one line that says what to check, and
exit code 1; SIGTERM or SIGINT ends the job with one line saying how to resume. torchrun's
own lines about its workers (how they ended, the signals that stopped them, its
OMP_NUM_THREADS banner) repeat those lines and are not shown, unless LOGLEVEL is set.
"""
import contextlib
import logging
import os
import signal
import sys
import tempfile

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import (RendezvousConnectionError, RendezvousError,
                                                      RendezvousTimeoutError)
from torch.distributed.run import get_args_parser, run

from utils.distributed import c10d_lines_hidden
from utils.errors import UserError
from utils.worker import LAUNCHER_PID, LINE_PRINTED, USER_ERROR_SIGNAL, a_line_was_printed


def launch(torchrun_argv):
    """Run torchrun with these arguments; returns the exit code."""
    config = get_args_parser().parse_args(torchrun_argv)
    handled = getattr(config, "signals_to_handle", None)  # torchrun's --signals_to_handle (recent torch)
    if handled is not None and USER_ERROR_SIGNAL.name not in handled.split(","):
        # the agent turns it into a SignalException, read below as "a worker's user error: no restart"
        config.signals_to_handle = f"{handled},{USER_ERROR_SIGNAL.name}"
    # the workers' check that this process lives (utils.worker.die_with_launcher); only for them
    os.environ[LAUNCHER_PID] = str(os.getpid())
    printed_fd, os.environ[LINE_PRINTED] = tempfile.mkstemp(prefix="tsl-line-printed-")
    os.close(printed_fd)
    try:
        with torchruns_lines_hidden(), rendezvous_lines_hidden():
            run(config)
    except ChildFailedError as failure:
        codes = sorted({f.exitcode for f in failure.failures.values()})
        if a_line_was_printed(os.environ[LINE_PRINTED]):  # a worker's user error: its line is all there is to say
            return 2 if 2 in codes else next((c for c in codes if c > 0), 1)  # others' broken collectives: 1
        print(f"error: {len(failure.failures)} worker(s) failed (exit codes {codes}); "
              "the first message above says why", file=sys.stderr)
        return next((c for c in codes if c > 0), 1)
    except RendezvousError as failure:
        print(f"error: {rendezvous_problem(failure, config)}", file=sys.stderr)
        return 1
    except SignalException as stop:
        if stop.sigval == USER_ERROR_SIGNAL:  # utils.worker.end_job_on_user_error: the worker said why
            return 2
        print(f"error: {stopped_line(stop.sigval.name)}", file=sys.stderr)
        return 128 + stop.sigval
    except KeyboardInterrupt:  # SIGINT before the agent took over its signals
        print(f"error: {stopped_line('SIGINT')}", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        os.environ.pop(LAUNCHER_PID, None)
        os.remove(os.environ.pop(LINE_PRINTED))
    return 0


# torchrun's loggers whose lines the launcher's or a worker's one line says already: a worker's end and
# the signals that stop the others; its OMP_NUM_THREADS banner (run.py sets its threads itself)
REPEATING_LOGGERS = ("torch.distributed.run", "torch.distributed.elastic.multiprocessing.api",
                     "torch.distributed.elastic.agent.server.api")


@contextlib.contextmanager
def torchruns_lines_hidden():
    """Hide REPEATING_LOGGERS' lines meanwhile, unless LOGLEVEL (torchrun's own switch) is set."""
    if os.environ.get("LOGLEVEL"):
        yield
        return
    loggers = [logging.getLogger(name) for name in REPEATING_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def rendezvous_lines_hidden():
    """Meanwhile, c10d's C++ lines are hidden while the agent reaches the rendezvous store and while it joins a
    rendezvous (utils.distributed.c10d_lines_hidden): a node that finds nothing listening at MASTER_ADDR:MASTER_PORT,
    or arrives after node 0 gave up, logged each failed try with 14 to 28 stack frames before the one line below.
    No worker runs then (the agent starts them after the rendezvous, and stops them before another), so no
    worker's output is held back. torch's launch_agent asks its rendezvous registry for the handler at call time."""
    from torch.distributed.elastic.rendezvous import registry

    get_handler = registry.get_rendezvous_handler

    def quiet_handler(params):
        with c10d_lines_hidden():
            handler = get_handler(params)
        next_rendezvous = handler.next_rendezvous

        def quiet_next_rendezvous(*args, **kwargs):
            with c10d_lines_hidden():
                return next_rendezvous(*args, **kwargs)

        handler.next_rendezvous = quiet_next_rendezvous
        return handler

    registry.get_rendezvous_handler = quiet_handler
    try:
        yield
    finally:
        registry.get_rendezvous_handler = get_handler


def device_workers(devices, nproc_per_node, gpus, visible=None):
    """TSLib's --use_multi_gpu and OpenLTM's --dp with --devices, as local DDP workers: (how many, the
    CUDA_VISIBLE_DEVICES they get, or None to leave it as it is). --devices are numbered among the GPUs
    this process sees (`visible`, its CUDA_VISIBLE_DEVICES, when set), as PyTorch numbers them, so worker
    LOCAL_RANK r computes on the r-th listed device. `gpus`: how many this process sees (0: the run is on
    the CPU, and the list only counts the workers)."""
    if nproc_per_node is not None and nproc_per_node != len(devices):
        raise UserError(f"--nproc_per_node {nproc_per_node} and --devices {','.join(map(str, devices))} "
                        f"({len(devices)} device(s)) disagree; one process runs per device: drop --nproc_per_node")
    if not gpus:
        return len(devices), None
    missing = [d for d in devices if d >= gpus]
    if missing:
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible else ""
        raise UserError(f"--devices {','.join(map(str, devices))} names GPU {missing[0]}, but this machine shows "
                        f"{gpus} GPU(s){shown}, numbered 0 to {gpus - 1}; choose among those")
    names = visible.split(",") if visible else [str(d) for d in range(gpus)]
    return len(devices), ",".join(names[d].strip() for d in devices)


def stopped_line(signal_name):
    """The one line of a run stopped from outside (SIGTERM, SIGINT): what happened, how to go on."""
    return (f"stopped by {signal_name}; every finished epoch is saved: run the same command with --resume to "
            "continue after the last one")


def rendezvous_problem(failure, config):
    """What went wrong before any worker started, and what to check."""
    where = f"rendezvous '{config.rdzv_id}' at {config.rdzv_endpoint or 'localhost'}"
    same = "start every node with the same --nnodes, --rdzv_id and --rdzv_endpoint (NNODES, RDZV_ID, " \
           "MASTER_ADDR:MASTER_PORT in scripts/ddp_forecast.sh)"
    if isinstance(failure, RendezvousTimeoutError):
        return f"not all {config.nnodes} node(s) joined {where} in time; {same}, or raise RDZV_TIMEOUT"
    if isinstance(failure, RendezvousConnectionError):
        cause = str(failure.__cause__ or failure).splitlines()[0].rstrip(".")
        return (f"cannot reach or host the store of {where} ({cause}); check that node 0 is running (if it "
                "stopped, its log says why), that MASTER_ADDR is its address, and that MASTER_PORT is free there "
                "and open to the other nodes")
    return f"{where} failed ({type(failure).__name__}: {failure}); {same}"


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
