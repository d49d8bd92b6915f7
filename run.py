"""Train, validate and test a forecaster: `python run.py --model DLinear`.

Every argument is in utils/arguments.py (TSLib's and OpenLTM's names, so their scripts run unchanged).
DDP: `torchrun --nproc_per_node N run.py --ddp ...`, or `python run.py --ddp` which starts
`--nproc_per_node` local workers through PyTorch's own launcher (torch.distributed.run), or
`srun ... python run.py --ddp`, one task per GPU (SLURM's variables mapped to torchrun's). TSLib's
`--use_multi_gpu` and OpenLTM's `--dp` (DataParallel there) start one DDP worker per `--devices` entry.
`--is_training 0` evaluates saved weights without training: this setting's, `--checkpoint`'s, OpenLTM's
`--test_dir`'s, or, zero-shot, pre-trained ones (`--pretrain_model_path`) on any data set.
"""
import logging
import os
import signal
import sys
import traceback

from utils.threads import quiet_waits_beside_busy_cores

quiet_waits_beside_busy_cores()  # before torch loads OpenMP, which reads its wait policy once

from data_provider.data_factory import data_fingerprint  # noqa: E402 (after the wait policy)
from exp.exp_forecast import Exp_Forecast
from exp.short_term import Exp_Short_Term_Forecast
from exp.outputs import predict, save_results
from exp.settings import data_parallel, evaluated_weights, resolve_args
from utils import distributed, worker
from utils.arguments import describe_ignored, parse_args
from utils.checkpoint import setting_lock
from utils.errors import NodeError, UserError
from utils.tools import keep_freed_memory

logger = logging.getLogger("tsl")


class MainFormatter(logging.Formatter):
    """Rank 0's lines: the message alone, warnings and errors labelled ("warning: ...")."""

    def format(self, record):
        message = super().format(record)
        return f"{record.levelname.lower()}: {message}" if record.levelno >= logging.WARNING else message


def configure_logging(quiet=False):
    """Rank 0 logs progress (with --quiet only the results); other ranks only warnings, with their rank in front."""
    from utils.progress import RESULT

    handler = logging.StreamHandler(sys.stdout)
    rank = distributed.env_rank()
    if rank == 0:
        handler.setFormatter(MainFormatter())
        logger.setLevel(RESULT if quiet else logging.INFO)
    else:
        handler.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s: %(message)s"))
        logger.setLevel(logging.WARNING)
    logger.handlers[:] = [handler]
    logger.propagate = False


def launch_local_workers(args):
    """`python run.py --ddp` outside torchrun: hand the same command line to torchrun's engine. With
    --use_multi_gpu / --dp --devices, one worker per listed device, shown only those devices."""
    import torch

    from utils.launch import device_workers, launch

    cuda = args.use_gpu and torch.cuda.is_available()
    nproc = args.nproc_per_node
    if data_parallel(args) and args.devices:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        nproc, shown = device_workers(args.devices, nproc, torch.cuda.device_count() if cuda else 0, visible)
        if shown is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = shown  # the workers' environment: torchrun passes it on
        if not args.quiet:
            where = f"CUDA_VISIBLE_DEVICES={shown}" if shown is not None else "gloo on the CPU"
            print(f"{'--use_multi_gpu' if args.use_multi_gpu else '--dp'} --devices {','.join(map(str, args.devices))}: "
                  f"DDP with {nproc} processes, one per device ({where}), --batch_size {args.batch_size} split between "
                  "them", flush=True)
    if nproc is None:
        nproc = torch.cuda.device_count() if cuda else 2
    return launch(["--standalone", f"--nproc_per_node={nproc}", os.path.abspath(__file__), *sys.argv[1:]])


class Stopped(BaseException):
    """SIGINT or SIGTERM: like KeyboardInterrupt, no `except Exception` catches it."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


def stop_quietly():
    """SIGINT and SIGTERM end a run with one line, never a traceback; the handlers they replace.

    One process: Stopped, and main prints how to resume. A worker: killed at once, silently (the
    launcher prints the line), even inside a collective, where a Python handler would wait.
    """
    handler = signal.SIG_DFL if distributed.launched_by_torchrun() else _stop
    return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}


def main(argv=None):
    args = parse_args(argv)
    # TSLib's --use_multi_gpu, OpenLTM's --dp: DDP, unless --devices names one device (then one process on it)
    ddp = args.ddp or (data_parallel(args) and (args.devices is None or len(args.devices) > 1))
    try:  # srun's tasks, one per GPU, become torchrun's workers (utils.worker.slurm_task_variables decides)
        slurm_task, slurm_warning = worker.adopt_slurm_task(ddp, args.nproc_per_node)
        if ddp and not distributed.launched_by_torchrun():
            if slurm_warning:
                print(f"warning: {slurm_warning}", file=sys.stderr)
            return launch_local_workers(args)
    except UserError as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not slurm_task:  # a task srun started has no launcher of ours: slurmstepd ends it with the step
        worker.die_with_launcher()
    previous = stop_quietly()
    configure_logging(args.quiet)
    if args.keep_freed_memory:
        keep_freed_memory()  # before the data and the model allocate
    if slurm_warning:
        logger.warning(slurm_warning)
    if args.ignored_args and distributed.env_rank() == 0:
        # rank 0 only, so a DDP job prints the line once; a warning, so --quiet keeps it (a typo must show)
        logger.warning(f"ignoring arguments run.py does not use: {describe_ignored(args.ignored_args)}")
    try:
        args, problem = resolve(args)
        device = distributed.setup(args.ddp, args.use_gpu, args.gpu, args.dist_timeout, args.num_threads)
        # every rank stops together, rank 0 saying why: a rank that left alone could get the
        # others killed by torchrun before rank 0 prints
        distributed.raise_on_every_rank(lambda: problem, on="all")
        require_same_data(args)
        return run_experiments(args, device)
    except UserError as problem:
        # the process group may not exist: rank 0 says why, each machine's first process what is wrong there,
        # each process that could not join the group why not
        # and a rank whose error is its own alone (a file cut under it mid-run) says it, if nobody else did
        lone = not isinstance(problem, (distributed.AgreedError, distributed.NoGroupError, NodeError))
        if (distributed.env_rank() == 0 or isinstance(problem, distributed.NoGroupError)
                or (isinstance(problem, NodeError) and distributed.local_rank() == 0)
                or (lone and worker.say_a_lone_error())):
            print(f"error: {problem}", file=sys.stderr, flush=True)
            worker.tell_the_launcher_a_line_was_printed()
        distributed.wait_for_the_message(problem)
        worker.end_job_on_user_error()  # a restart would meet the same error
        return 2
    except Exception:
        if not distributed.launched_by_torchrun():
            raise  # one process: Python prints the traceback and exits 1, as usual
        # A bug, possibly on this rank alone: leave at once, without destroying the process group (NCCL's
        # shutdown can wait for peers that wait in a collective for this rank: a hang until the watchdog).
        # torchrun's agent sees the exit and stops the other ranks. A rank whose collective broke because
        # another one left with its user error's line printed adds no traceback to that line.
        if not worker.a_line_was_printed():
            traceback.print_exc()
        distributed.exit_process(1)
    except Stopped as stop:
        from utils.launch import stopped_line

        print(f"error: {stopped_line(signal.Signals(stop.signum).name)}", file=sys.stderr)
        return 128 + stop.signum
    finally:
        distributed.cleanup()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def resolve(args):
    """(the settled run, None) from exp.settings.resolve_args, or (args, its UserError as a message), raised once
    every rank can raise it (resolve_args first decides --ddp: a worker of torchrun joins the group)."""
    try:
        return resolve_args(args, distributed.env_world_size()), None
    except UserError as problem:
        return args, str(problem)


def require_same_data(args):
    """Every rank prepared the same data (each node reads its own copy of the files), or every rank
    stops with one line naming who differs: not a collective timeout, not a silently mixed run."""
    if distributed.world_size() == 1:
        return
    fingerprint = []
    distributed.raise_on_every_rank(lambda: fingerprint.append(data_fingerprint(args)), on="all")
    distributed.require_identical(fingerprint[0], "the prepared data", "give every node the same data files "
                                  f"(--root_path {args.root_path}, --data_path {args.data_path})")


def run_experiments(settled, device):
    for ii in range(settled.itr):
        args = settled.for_itr(ii)  # the seed --seed + ii: the model's and the loaders'; the data keeps --synthetic_seed
        exp = (Exp_Short_Term_Forecast if args.task_name == "short_term_forecast" else Exp_Forecast)(args, device)
        setting = args.setting
        with setting_lock(args, setting):  # training: no other run writes this setting meanwhile
            if args.is_training:
                training = exp.train(setting)
                metrics = exp.test(setting)
            else:  # saved weights, untrained here; zero-shot: pre-trained ones on this data set
                training = None
                weights, pretrained = evaluated_weights(args, setting)
                metrics = exp.test(setting, checkpoint=weights, pretrained=pretrained)
            save_results(args, setting, metrics, training)
            if args.do_predict:
                predict(exp, setting)
    return 0


if __name__ == "__main__":
    distributed.exit_process(main())
