"""Train, validate and test a forecaster: `python run.py --model DLinear`.

Every argument is in utils/arguments.py (TSLib's and OpenLTM's names).
DDP: `torchrun --nproc_per_node N run.py --ddp ...`, or `python run.py --ddp` which starts
`--nproc_per_node` local workers through PyTorch's own launcher (torch.distributed.run).
"""
import logging
import os
import sys

from utils import distributed
from utils.arguments import describe_ignored, parse_args
from utils.errors import UserError

logger = logging.getLogger("tsl")


def setting_name(args, ii):
    parts = [args.task_name, args.model_id, args.model, args.data, f"ft{args.features}", f"sl{args.seq_len}",
             f"ll{args.label_len}", f"pl{args.pred_len}", f"dm{args.d_model}", f"nh{args.n_heads}",
             f"el{args.e_layers}", f"dl{args.d_layers}", f"df{args.d_ff}"]
    if args.autoregressive:
        parts += [f"it{args.input_token_len}", f"ot{args.output_token_len}"]
    return "_".join(parts + [args.des, str(ii)])


def configure_logging(quiet=False):
    """Rank 0 logs progress (with --quiet only the results); other ranks only warnings, with their rank in front."""
    from utils.progress import RESULT

    handler = logging.StreamHandler(sys.stdout)
    rank = int(os.environ.get("RANK", 0))
    if rank == 0:
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.setLevel(RESULT if quiet else logging.INFO)
    else:
        handler.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s: %(message)s"))
        logger.setLevel(logging.WARNING)
    logger.handlers[:] = [handler]
    logger.propagate = False


def launch_local_workers(args):
    """`python run.py --ddp` outside torchrun: hand the same command line to torchrun's engine."""
    import torch

    from utils.launch import launch

    nproc = args.nproc_per_node
    if nproc is None:
        nproc = torch.cuda.device_count() if args.use_gpu and torch.cuda.is_available() else 2
    return launch(["--standalone", f"--nproc_per_node={nproc}", os.path.abspath(__file__), *sys.argv[1:]])


def main(argv=None):
    args = parse_args(argv)
    if args.ddp and not distributed.launched_by_torchrun():
        return launch_local_workers(args)
    args.ddp = args.ddp or distributed.launched_by_torchrun()
    configure_logging(args.quiet)
    if args.ignored_args:
        # info level: only rank 0 logs it, so a DDP job prints the line once
        logger.info(f"warning: ignoring arguments run.py does not use: {describe_ignored(args.ignored_args)}")
    try:
        return run_experiments(args)
    except UserError as problem:
        if int(os.environ.get("RANK", 0)) == 0:  # the process group may not exist yet
            print(f"error: {problem}", file=sys.stderr)
        return 2
    finally:
        distributed.cleanup()


def run_experiments(args):
    from exp.exp_forecast import Exp_Forecast

    base_seed = args.seed
    for ii in range(args.itr):
        args.seed = base_seed + ii
        exp = Exp_Forecast(args)
        setting = setting_name(args, ii)
        if args.is_training:
            training = exp.train(setting)
            metrics = exp.test(setting)
        else:
            training = None
            checkpoint = args.checkpoint or os.path.join(args.checkpoints, setting, "checkpoint.pth")
            metrics = exp.test(setting, checkpoint=checkpoint)
        exp.save_results(setting, metrics, training)
        if args.do_predict:
            exp.predict(setting)
    return 0


if __name__ == "__main__":
    distributed.exit_process(main())
