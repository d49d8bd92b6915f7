"""The process group and what every rank does with it: setup / cleanup, rank queries, the collectives,
and the agreement by which every rank stops together on one error.

Single-process runs go through the same functions: every helper is a no-op (or the
identity) when no process group is initialised. The model's side (DDP, BatchNorm, ZeRO) is
utils.ddp; what a worker tells its launcher, and srun's tasks as workers, utils.worker.
"""
import contextlib
import datetime
import gc
import logging
import os
import re
import socket
import sys
import tempfile
import threading

import torch
import torch.distributed as dist

from utils.errors import NodeError, UserError


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


def env_rank():
    """This process's rank as torchrun announces it (0 outside torchrun), known before any process group."""
    return int(os.environ.get("RANK", 0))


def env_world_size():
    """The number of processes torchrun started (1 outside torchrun), known before any process group."""
    return int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else 1


def setup(ddp, use_gpu, gpu, timeout_s, threads):
    """The torch.device this process computes on; with `ddp`, after joining the process group
    that torchrun's env:// variables describe (nccl on GPU, gloo on CPU).

    On CUDA (`use_gpu` and a GPU visible): without DDP the GPU `gpu` (--gpu, default 0), under DDP
    the GPU of this process's LOCAL_RANK (cuda_device_index); it becomes the current device.
    `threads` torch threads (0: under torchrun, the cores split between local processes).
    """
    cuda = use_gpu and torch.cuda.is_available()
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", cuda_device_index(ddp, gpu))
        torch.cuda.set_device(device)  # the current device: its generator, its NCCL communicator
    if ddp and not is_dist():
        _init_process_group(cuda, device, timeout_s)
    _set_threads(threads)
    return device


def cuda_device_index(ddp, gpu=None):
    """The visible GPU this process computes on, or a NodeError that says why there is none.

    Under DDP: LOCAL_RANK's GPU, or GPU 0 when each process sees exactly one through
    CUDA_VISIBLE_DEVICES (SLURM --gpus-per-task=1 sets it per task). Every process of a machine
    decides from the same counts, so they all refuse together; processes shown the same single
    GPU are caught by NCCL's own check when the group starts (_init_process_group).
    """
    visible = torch.cuda.device_count()
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"{visible} GPU(s)" + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
    if not ddp:
        index = 0 if gpu is None else gpu
        if index >= visible:
            raise UserError(f"--gpu {index} is not a GPU of this machine: it shows {seen}, numbered 0 to "
                            f"{visible - 1}; choose one of those")
        return index
    if visible == 1 and shown is not None:
        return 0
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank() + 1))
    if max(processes, local_rank() + 1) > visible:
        raise NodeError(f"LOCAL_RANK {local_rank()} has no GPU of its own on {socket.gethostname()}: it runs "
                        f"{processes} processes but shows {seen}; start at most {visible} per machine "
                        f"(--nproc_per_node {visible}), or show each process exactly one GPU (SLURM "
                        "--gpus-per-task=1, or CUDA_VISIBLE_DEVICES per process)")
    return local_rank()


def _init_process_group(cuda, device, timeout_s):
    options = dict(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s),
                   device_id=device if cuda else None)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = None  # None: env://, torchrun's agent hosts the store
    if restart and agent_store:
        # After an elastic restart torchrun's store still holds the previous group's
        # connection keys; a per-attempt prefix keeps the new group from reading them.
        store = dist.PrefixStore(f"restart_{restart}", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
            is_master=False, timeout=options["timeout"]))
    elif not agent_store and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        store = _store_of_rank_0(timeout_s)  # srun's tasks, or variables set by hand
    try:
        if store is None:
            dist.init_process_group(init_method="env://", **options)
        else:
            dist.init_process_group(store=store, rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]), **options)
    except RuntimeError as error:  # torch.distributed.DistBackendError
        # CUDA_VISIBLE_DEVICES=0 exported for every process of a 1-GPU machine: NCCL refuses
        # on every rank at once, with a traceback that names a bus id, not the fix
        if "Duplicate GPU detected" not in str(error):
            raise
        raise NodeError(f"two processes of this job share one GPU on {socket.gethostname()} (NCCL: "
                        "Duplicate GPU detected): each process needs a GPU of its own; start at most as "
                        "many processes per machine as it has GPUs, or show each process a different "
                        "one (CUDA_VISIBLE_DEVICES)") from None


class NoGroupError(UserError):
    """This process could not join the process group, so it cannot tell the others: every process
    that meets it prints its line (run.py), not rank 0 alone."""


FREE_PORT = "set MASTER_PORT to a free port, the same for every process"


# c10d's C++ log lines ("[W1207 14:20:13.113545931 TCPStore.cpp:340] [c10d] ...") and, under each, the
# exception it logged: "Exception raised from ...", "frame #N: ...", "<omitting python frames>", a blank line
C10D_LINE = re.compile(r"^\[[IWEF]\d{4} [\d:.]+ [^\]]*\] \[c10d\] ")
C10D_TRACE = re.compile(r"^(Exception raised from |frame #\d+: |<omitting python frames>|$)")


def without_c10d_lines(text):
    """`text` (what reached stderr) less c10d's log lines and the stack traces under them."""
    kept, in_record = [], False
    for line in text.splitlines(keepends=True):
        if C10D_LINE.match(line):
            in_record = True
        elif not (in_record and C10D_TRACE.match(line)):
            in_record = False
            kept.append(line)
    return "".join(kept)


def cpp_logs_asked():
    """Whether the user asked for torch's C++ logs (then nothing of theirs is hidden)."""
    return any(os.environ.get(name) for name in ("TORCH_CPP_LOG_LEVEL", "TORCH_DISTRIBUTED_DEBUG", "LOGLEVEL"))


@contextlib.contextmanager
def c10d_lines_hidden():
    """Keep c10d's C++ lines off stderr meanwhile: reaching a store that is not there (nothing listens at
    MASTER_PORT, or rank 0 gave up), c10d logs each failed try with the exception's 14 to 28 stack frames,
    before the one line that says what to check. Anything else that reaches stderr meanwhile is written out
    after. Yields give_up(): call it before leaving when a thread that may still log is left behind (the join
    of _store_of_rank_0); the C++ side of stderr then stays closed for the rest of the process, which is
    ending with its one line, and Python's sys.stderr writes where stderr went. Nothing is hidden when
    TORCH_CPP_LOG_LEVEL, TORCH_DISTRIBUTED_DEBUG or LOGLEVEL asks for logs."""
    if cpp_logs_asked():
        yield lambda: None
        return
    sys.stderr.flush()
    real, capture, gave_up = os.dup(2), tempfile.TemporaryFile(), []
    os.dup2(capture.fileno(), 2)
    try:
        yield lambda: gave_up.append(True)
    finally:
        sys.stderr.flush()
        if gave_up:
            with open(os.devnull, "wb") as nowhere:
                os.dup2(nowhere.fileno(), 2)
            sys.stderr = open(real, "w", buffering=1, errors="backslashreplace")
        else:
            os.dup2(real, 2)
            os.close(real)
        capture.seek(0)
        kept = without_c10d_lines(capture.read().decode(errors="replace"))
        capture.close()
        if kept:
            sys.stderr.write(kept)
            sys.stderr.flush()


def _store_of_rank_0(timeout_s):
    """The store env:// would make (rank 0 hosts it at MASTER_ADDR:MASTER_PORT, the others join), with
    every wait ending within timeout_s in one line naming the port. torch's own client waits forever
    on a program there that accepts connections but never answers (it reads the store's first reply
    without a timeout), so the others join in a thread that is given up after timeout_s."""
    with c10d_lines_hidden() as give_up:
        return _join_store_of_rank_0(timeout_s, give_up)


def _join_store_of_rank_0(timeout_s, give_up):
    addr, port, world = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=timeout_s)
    where = f"MASTER_ADDR:MASTER_PORT={addr}:{port}"
    no_group = f"no process group formed at {where} within {timeout_s} s"
    if env_rank() == 0:
        try:
            return dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, multi_tenant=True)
        except RuntimeError as error:  # torch.distributed.DistNetworkError, DistStoreError
            if "EADDRINUSE" in str(error):
                raise NoGroupError(f"the port of {where} is taken by another program, so rank 0 cannot host the "
                                   f"process group there; {FREE_PORT}") from None
            if not isinstance(error, dist.DistError):
                raise
            count = re.search(r"(\d+)/(\d+) clients joined", str(error))  # a DistStoreError's text
            why = f"{count[1]} of {count[2]} processes joined" if count else str(error).splitlines()[0].rstrip(".")
            raise NoGroupError(f"{no_group}: {why}; start every process with the same MASTER_ADDR, MASTER_PORT and "
                               "WORLD_SIZE") from None
    joined = []

    def join():
        try:
            joined.append(dist.TCPStore(addr, port, world, is_master=False, timeout=timeout))
        except Exception as error:  # handed to the waiting thread
            joined.append(error)

    joining = threading.Thread(target=join, name="join rank 0's store", daemon=True)
    joining.start()
    joining.join(timeout_s)
    if joined and not isinstance(joined[0], Exception):
        return joined[0]
    if joined and not isinstance(joined[0], dist.DistError):
        raise joined[0]
    if not joined:
        give_up()  # the join goes on trying, and c10d logs each try
    raise NoGroupError(f"{no_group}: rank 0 never answered there; is another program listening on that port (then "
                       f"{FREE_PORT}), or did rank 0 stop (its own line says why)?") from None


def _set_threads(threads):
    """`threads` torch threads, or with 0 the cores this process may use split between the machine's
    processes (utils.threads: affinity mask, cgroup quota, LOCAL_WORLD_SIZE)."""
    from utils.threads import choose_threads

    threads, _ = choose_threads(threads)
    if threads:
        torch.set_num_threads(threads)


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


def peak_gpu_mib(device):
    """Every rank's peak GPU memory so far in MiB (torch.cuda.max_memory_allocated), in rank order;
    None when the run computes on the CPU. A collective on GPUs: every rank calls it."""
    if device.type != "cuda":
        return None
    return gather_objects(round(torch.cuda.max_memory_allocated(device) / 2**20, 1))


def gather_on_main(obj):
    """List of every rank's object, in rank order, on rank 0; None on the other ranks (which
    then hold no copy of what only rank 0 needs)."""
    if not is_dist():
        return [obj]
    out = [None] * world_size() if is_main() else None
    dist.gather_object(obj, out, dst=0)
    return out


def raise_on_every_rank(check, on="main"):
    """Decide on rank 0 (on="main") or on every rank (on="all"), then stop every rank together.

    check() returns None, or a message (or raises UserError). If any rank that ran it found a
    problem, every rank raises UserError with the first message in rank order; nobody is left
    waiting in a collective for a rank that stopped alone.
    """
    if on not in ("main", "all"):
        raise ValueError(f"on must be 'main' or 'all', got {on!r}")
    problem = None
    if on == "all" or is_main():
        try:
            problem = check()
        except UserError as exc:
            problem = str(exc)
    if on == "main":
        problem = broadcast_object(problem)
    else:
        problem = next((p for p in gather_objects(problem) if p is not None), None)
    if problem is not None:
        raise AgreedError(problem)


class AgreedError(UserError):
    """A UserError every rank raised together (raise_on_every_rank): rank 0 prints it, and the other
    ranks may wait for that (wait_for_the_message) without meeting a rank that is elsewhere."""


def wait_for_the_message(problem):
    """After rank 0 printed an AgreedError, every rank leaves together: a rank that left first would have
    torchrun's agent kill rank 0 before its line was out (a busy machine can delay it that long)."""
    if isinstance(problem, AgreedError) and is_dist():
        try:
            barrier()
        except Exception:  # a broken group: leaving is all that is left to do
            pass


def require_same(value, message):
    """Raise UserError(message) on every rank unless every rank holds an equal `value`.

    For what each node decides from its own disk: if a node sees other files, all ranks
    stop together with one message instead of going separate ways.
    """
    values = gather_objects(value)
    raise_on_every_rank(lambda: message if any(v != values[0] for v in values) else None, on="main")


def require_identical(value, what, fix):
    """Raise the same UserError on every rank unless every rank holds an equal `value` (a str),
    naming the ranks and hosts that hold each value. Every rank decides from the same gathered
    list, so they all raise together."""
    if not is_dist():
        return
    holders = {}
    for r, (v, host) in enumerate(gather_objects((value, socket.gethostname()))):
        holders.setdefault(v, []).append(f"{r} ({host})")
    if len(holders) > 1:
        raise UserError(f"{what} differs between processes: "
                        + "; ".join(f"rank {', '.join(ranks)}: {v}" for v, ranks in holders.items()) + f"; {fix}")


def load_on_main(module, load, *args, **kwargs):
    """load(module, *args, **kwargs) on rank 0 only, then rank 0's weights on every rank.

    Only rank 0 reads the file, so the nodes of a multi-node job need not share a disk. A
    UserError from rank 0 is raised on every rank: nobody waits for weights that never come. A module
    FSDP2 shards: utils.ddp.load_on_main.
    """
    def load_on_this_rank():
        load(module, *args, **kwargs)  # returns None: raise_on_every_rank's "no problem"

    raise_on_every_rank(load_on_this_rank, on="main")
    if is_dist():
        with torch.no_grad():
            for tensor in module.state_dict().values():
                box = tensor if tensor.is_contiguous() else tensor.contiguous()
                dist.broadcast(box, src=0)
                if box is not tensor:
                    tensor.copy_(box)
    return module


def broadcast_buffers(module):
    """Rank 0's floating buffers (BatchNorm running statistics) on every rank, in one collective.

    Each rank's last training forward updates its running statistics from its own batch, so
    without this every rank would evaluate a slightly different model than the one rank 0
    saves. A no-op without a process group or without floating buffers.
    """
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    if not is_dist() or not buffers:
        return module
    with torch.no_grad():
        # float64 holds every float16/bfloat16/float32 value exactly: one flat tensor for all
        flat = torch.cat([b.detach().reshape(-1).to(_device_for_collectives(), torch.float64) for b in buffers])
        dist.broadcast(flat, src=0)
        for buffer, value in zip(buffers, flat.split([b.numel() for b in buffers])):
            buffer.copy_(value.view_as(buffer))
    return module


def shard_range(n, rank_=None, world_size_=None):
    """Contiguous, non-overlapping [start, stop) share of n items for a rank.

    Unlike DistributedSampler, nothing is padded: shares differ by at most one item
    and every item is counted exactly once across ranks.
    """
    r = rank() if rank_ is None else rank_
    w = world_size() if world_size_ is None else world_size_
    return (n * r) // w, (n * (r + 1)) // w
