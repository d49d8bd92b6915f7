"""Everything distributed lives here, so experiment code reads like single-process code.

Single-process runs go through the same functions: every helper is a no-op (or the
identity) when no process group is initialised.
"""
import datetime
import gc
import logging
import os
import sys

import torch
import torch.distributed as dist


def launched_by_torchrun():
    """True inside a worker started by torchrun / torch.distributed.run."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_dist():
    return dist.is_available() and dist.is_initialized()


def rank():
    return dist.get_rank() if is_dist() else 0


def local_rank():
    return int(os.environ.get("LOCAL_RANK", 0))


def world_size():
    return dist.get_world_size() if is_dist() else 1


def is_main():
    """The one process that prints and writes files."""
    return rank() == 0


def setup(use_gpu, timeout_s):
    """Join the process group described by torchrun's env:// variables.

    Returns the torch.device this rank computes on. nccl on GPU, gloo on CPU.
    """
    cuda = use_gpu and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank())
        device = torch.device("cuda", local_rank())
    else:
        device = torch.device("cpu")
    if not is_dist():
        options = dict(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s),
                       device_id=device if cuda else None)
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        if restart and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # After an elastic restart torchrun's store still holds the previous group's
            # connection keys; a per-attempt prefix keeps the new group from reading them.
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                  int(os.environ["WORLD_SIZE"]), is_master=False, timeout=options["timeout"])
            dist.init_process_group(store=dist.PrefixStore(f"restart_{restart}", store),
                                    rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), **options)
        else:
            dist.init_process_group(init_method="env://", **options)
    return device


def cleanup():
    """Destroy the process group while the interpreter is whole.

    A DDP wrapper sits in reference cycles and holds the group; collect it first. Left to
    interpreter shutdown, gloo's worker threads abort the process (exit code -6) at random.
    """
    if is_dist():
        gc.collect()
        dist.destroy_process_group()


def exit_process(code):
    """End this process with `code`, skipping interpreter teardown when it ran distributed.

    Even after destroy_process_group, C++ threads of gloo and the TCP store can still be
    joinable when static destructors run; at random that aborts a worker which had finished
    cleanly ("terminate called without an active exception", exit -6) and fails the job.
    Results are on disk (atomic saves fsync), so flush the streams and leave directly.
    """
    if not launched_by_torchrun():
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if code is None else code if isinstance(code, int) else 1)


def barrier():
    if is_dist():
        dist.barrier()


def _device_for_collectives():
    if is_dist() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values):
    """Sum a list of numbers over all ranks in float64; returns a list of floats.

    One collective for all values, so callers pass every statistic they need at once.
    """
    t = torch.tensor(values, dtype=torch.float64, device=_device_for_collectives())
    if is_dist():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def any_rank(flag):
    """True on every rank if `flag` is True on at least one rank."""
    return all_reduce_sum([1.0 if flag else 0.0])[0] > 0


def broadcast_object(obj, src=0):
    """Rank `src`'s object, on every rank."""
    if not is_dist():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj):
    """List of every rank's object, in rank order, on every rank."""
    if not is_dist():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def shard_range(n, rank_=None, world_size_=None):
    """Contiguous, non-overlapping [start, stop) share of n items for a rank.

    Unlike DistributedSampler, nothing is padded: shares differ by at most one item
    and every item is counted exactly once across ranks.
    """
    r = rank() if rank_ is None else rank_
    w = world_size() if world_size_ is None else world_size_
    return (n * r) // w, (n * (r + 1)) // w
