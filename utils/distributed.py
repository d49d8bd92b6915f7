"""Everything distributed lives here, so experiment code reads like single-process code.

Single-process runs go through the same functions: every helper is a no-op (or the
identity) when no process group is initialised.
"""
import contextlib
import datetime
import functools
import gc
import inspect
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from utils.errors import NodeError, UserError


def launched_by_torchrun():
    """True inside a worker started by torchrun / torch.distributed.run."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


LAUNCHER_PID = "TSL_LAUNCHER_PID"  # set by utils.launch: the pid the workers it starts must outlive
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_launcher():
    """Under torchrun, end this worker the moment its launcher (the elastic agent) dies.

    torchrun starts workers in their own session, so a SIGKILLed agent would leave them training
    under PID 1 and appending results after the job was reported failed. On Linux the kernel
    sends SIGKILL when the parent exits (prctl PR_SET_PDEATHSIG); a parent that died before that
    call is seen by comparing the parent pid with the launcher's (utils.launch records it; under
    an external torchrun, the parent at this call).
    """
    if not launched_by_torchrun():
        return
    launcher = int(os.environ.get(LAUNCHER_PID) or 0) or os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != launcher:
        print(f"error: the launcher (pid {launcher}) is gone; this worker stops", file=sys.stderr)
        os._exit(1)


LINE_PRINTED = "TSL_LINE_PRINTED"  # set by utils.launch: a file its workers write to once one printed a user error


def tell_the_launcher_a_line_was_printed():
    """After this worker printed a user error's line: utils.launch then adds no line of its own."""
    if os.environ.get(LINE_PRINTED):
        with open(os.environ[LINE_PRINTED], "a") as f:
            f.write(f"rank {env_rank()}\n")


def a_line_was_printed(printed=None):
    """Whether a worker of this launch printed a user error's line (tell_the_launcher_a_line_was_printed);
    `printed` is the file utils.launch gave its workers, by default this worker's. False outside utils.launch."""
    printed = printed or os.environ.get(LINE_PRINTED)
    try:
        return bool(printed) and os.path.getsize(printed) > 0
    except OSError:
        return False


def say_a_lone_error(wait_s=2.0):
    """Whether this rank, whose user error no other rank shares (not an AgreedError: a file that changed under
    it mid-run), prints the line itself. Rank 0 always does; another rank under utils.launch does when no worker
    has printed one within `wait_s` (rank 0 may be stopping on the same error, or waiting in a collective for this
    rank, where it never would). Under another launcher only rank 0 prints, as for every error."""
    if env_rank() == 0:
        return True
    if not os.environ.get(LINE_PRINTED):
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if a_line_was_printed():
            return False
        time.sleep(0.05)
    return not a_line_was_printed()


USER_ERROR_SIGNAL = signal.SIGUSR1  # worker -> agent: a user error, restarting cannot help (utils.launch)


def end_job_on_user_error():
    """Under torchrun with restarts left (TORCHELASTIC_MAX_RESTARTS > 0), ask this node's agent to
    stop instead of restarting the group into the same deterministic error (a missing file, a bad
    argument). torchrun's agent has no such verdict of its own: it restarts on any non-zero exit.

    Local rank 0 signals the agent (its parent): USER_ERROR_SIGNAL when the agent handles it (utils.launch
    has it do so and ends with exit code 2), else SIGTERM (an external torchrun stops, printing its
    own traceback). Every rank raises a UserError together, so every node's agent is told.
    """
    if (not launched_by_torchrun() or local_rank() != 0
            or int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) == 0):
        return
    handled = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "").split(",")
    os.kill(os.getppid(), USER_ERROR_SIGNAL if USER_ERROR_SIGNAL.name in handled else signal.SIGTERM)


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


# ---------------------------------------------------------------- SLURM: srun's tasks as torchrun's workers
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# Step ids from here up are no srun step: the batch script's (0xfffffffb), salloc's interactive
# step, the extern step; the batch script shows none or one of these
SLURM_SPECIAL_STEPS = 0xFFFFFFF0
SLURM_SET_BY_HAND = "srun sets the SLURM_* variables of every task it starts; set by hand, they must describe one task"


def slurm_task_variables(environ, ddp, nproc_per_node=None, first_host=None):
    """The one place that decides what a task srun started is to torch: (variables to add to the
    environment, a warning or None). Reads `environ` only, and calls first_host(node list) when
    MASTER_ADDR is to be found (default: first_slurm_host).

    One task per GPU without torchrun (`srun --ntasks-per-node=G python run.py --ddp ...`): every
    task of a srun step of two or more tasks becomes the worker torchrun would have started,

        RANK = SLURM_PROCID                WORLD_SIZE = SLURM_STEP_NUM_TASKS (else SLURM_NTASKS)
        LOCAL_RANK = SLURM_LOCALID         LOCAL_WORLD_SIZE = this node's (SLURM_NODEID's) entry of
                                           SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE,
                                           SLURM_NTASKS_PER_NODE)
        MASTER_ADDR = as given, else the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
                      where task 0 runs
        MASTER_PORT = as given, else 15000 + SLURM_JOB_ID % 20000

    Nothing is added when RANK, WORLD_SIZE or LOCAL_RANK is set (torchrun inside srun, as
    scripts/slurm/ddp_forecast.sbatch starts it, wins), outside a srun step (no SLURM_PROCID, or the
    batch script itself: no SLURM_STEP_ID), for a step of one task (--ddp then starts local workers,
    as anywhere), or without --ddp: then the warning says each task trains alone. A value that does
    not fit, or --nproc_per_node in a step of several tasks, raises UserError with one line.
    """
    if any(name in environ for name in TORCHRUN_VARIABLES) or "SLURM_PROCID" not in environ:
        return {}, None
    tasks_name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    tasks_text = environ.get(tasks_name, "").strip()
    if tasks_text == "1":
        return {}, None
    several = tasks_text.isdigit() and int(tasks_text) > 1
    step = environ.get("SLURM_STEP_ID", "").strip()
    if not (step.isdigit() and int(step) < SLURM_SPECIAL_STEPS):
        if ddp and several:
            return {}, (f"this process is the batch script of a job of {tasks_text} tasks ({tasks_name}), not a task "
                        "srun started: --ddp starts its own local workers here; to run one process per task, start "
                        "it with srun (docs/scaling.md#slurm)")
        return {}, None
    if not ddp:
        if several:
            return {}, (f"this is task {environ['SLURM_PROCID']} of {tasks_text} that srun started, but --ddp is not "
                        f"given: each task trains alone, on all the data; add --ddp to train as one job of "
                        f"{tasks_text} processes")
        return {}, None
    if nproc_per_node is not None:
        raise UserError(f"--nproc_per_node starts local workers, but srun started this task as one of {tasks_text} "
                        "processes already: leave --nproc_per_node out, or start one task per node that runs "
                        "torchrun (scripts/slurm/ddp_forecast.sbatch)")
    tasks = _slurm_number(environ, tasks_name, 1)
    rank = _slurm_number(environ, "SLURM_PROCID")
    local_rank = _slurm_number(environ, "SLURM_LOCALID")
    local_tasks, local_name = _slurm_local_tasks(environ)
    if rank >= tasks:
        raise UserError(f"SLURM_PROCID={rank} is not a task of {tasks_name}={tasks} (tasks are numbered 0 to "
                        f"{tasks - 1}); {SLURM_SET_BY_HAND}")
    if not local_rank < local_tasks <= tasks:
        raise UserError(f"SLURM_LOCALID={local_rank} is not one of the {local_tasks} task(s) that {local_name} "
                        f"counts on this node (of {tasks_name}={tasks}); {SLURM_SET_BY_HAND}")
    variables = dict(RANK=str(rank), WORLD_SIZE=str(tasks), LOCAL_RANK=str(local_rank),
                     LOCAL_WORLD_SIZE=str(local_tasks))
    if not environ.get("MASTER_ADDR"):
        nodes_name = next((name for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                           if environ.get(name)), None)
        host = (first_host or first_slurm_host)(environ[nodes_name]) if nodes_name else None
        if not host:
            where = f"the first host of {nodes_name}={environ[nodes_name]!r}" if nodes_name else "SLURM's node list"
            raise UserError(f"set MASTER_ADDR to the address of the node that runs task 0 (SLURM_PROCID=0): {where} "
                            "cannot be found here (scontrol show hostnames is not available)")
        variables["MASTER_ADDR"] = host
    if not environ.get("MASTER_PORT"):
        job = environ.get("SLURM_JOB_ID", "").strip()
        if not job.isdigit():
            raise UserError("set MASTER_PORT to a free port on the node that runs task 0: it is derived from "
                            f"SLURM_JOB_ID, which is {job!r} here")
        variables["MASTER_PORT"] = str(15000 + int(job) % 20000)
    return variables, None


def _slurm_number(environ, name, minimum=0):
    text = environ.get(name, "").strip()
    if not text.isdigit() or int(text) < minimum:
        shown = f"{name}={text!r} is not a whole number >= {minimum}" if name in environ else f"{name} is not set"
        raise UserError(f"{shown}; {SLURM_SET_BY_HAND}")
    return int(text)


def _slurm_local_tasks(environ):
    """(how many tasks of this step run on this node, the variable that says so): SLURM's per-node
    counts ('2(x3),1': 2, 2, 2, 1), this node's (SLURM_NODEID) entry."""
    name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
                 if environ.get(n)), None)
    if name is None:
        raise UserError("SLURM_STEP_TASKS_PER_NODE is not set: the tasks on this node cannot be counted; "
                        f"{SLURM_SET_BY_HAND}")
    counts = []
    for item in environ[name].split(","):
        match = re.fullmatch(r"([1-9][0-9]*)(?:\(x([1-9][0-9]*)\))?", item.strip())
        if not match:
            raise UserError(f"{name}={environ[name]!r} is not a list of tasks per node like '4' or '2(x3),1'; "
                            f"{SLURM_SET_BY_HAND}")
        counts += [int(match[1])] * int(match[2] or 1)
    if len(set(counts)) == 1:
        return counts[0], name
    node = _slurm_number(environ, "SLURM_NODEID")
    if node >= len(counts):
        raise UserError(f"SLURM_NODEID={node} has no entry in {name}={environ[name]!r}; {SLURM_SET_BY_HAND}")
    return counts[node], name


def first_slurm_host(nodelist):
    """The first host of a SLURM node list ('gpu[07-08],cpu1': gpu07), by `scontrol show hostnames`;
    without scontrol the first name of a plain list ('a,b'); None when neither can tell."""
    if shutil.which("scontrol"):
        try:
            shown = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                   timeout=60)
            if shown.returncode == 0 and shown.stdout.split():
                return shown.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    first = nodelist.split(",")[0].strip()
    return first if first and "[" not in first else None


def adopt_slurm_task(ddp, nproc_per_node=None):
    """Under srun, one task per GPU without torchrun: torchrun's env:// variables from SLURM's, in this
    process's environment, before anything reads them (slurm_task_variables decides). Variables
    already set are never replaced. Returns (whether this process became a DDP worker so, the
    warning to print or None)."""
    variables, warning = slurm_task_variables(os.environ, ddp, nproc_per_node)
    for name, value in variables.items():
        os.environ.setdefault(name, value)
    return bool(variables), warning


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
    UserError from rank 0 is raised on every rank: nobody waits for weights that never come.
    """
    def load_on_this_rank():
        load(module, *args, **kwargs)

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


# ---------------------------------------------------------------- scaling up: wrapping, accumulation, ZeRO
def convert_sync_batchnorm(module, device=None):
    """`module` with its BatchNorm layers normalising with the global batch's statistics when distributed
    over several processes: torch.nn.SyncBatchNorm on GPUs, GlobalBatchNorm on the CPU (where PyTorch has
    none); unchanged otherwise. Parameter and buffer names stay the same."""
    if world_size() == 1:
        return module
    if device is not None and torch.device(device).type == "cpu":
        return GlobalBatchNorm.convert(module)
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)


class _SummedOverRanks(torch.autograd.Function):
    """The sum of a tensor over every rank, differentiable: the gradient is summed over the ranks too."""

    @staticmethod
    def forward(ctx, tensor):
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total


class GlobalBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are those of every rank's batch together, for the CPU (gloo),
    where torch.nn.SyncBatchNorm does not run: the per-channel sums, then the centred squares, are
    all-reduced, differentiably (_SummedOverRanks), so backward sums each rank's share
    of the statistics' gradient as SyncBatchNorm's does. Evaluation, one process, and `local` (set by
    local_batch_norm) are plain BatchNorm. The same parameters, buffers and state_dict keys."""

    local = False
    contributes = True

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (batch, channels, ...), got {input.dim()}-D")

    @classmethod
    def convert(cls, module):
        """`module` with every plain BatchNorm layer replaced by a GlobalBatchNorm holding its tensors."""
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats)
            converted.load_state_dict(module.state_dict())
            converted.train(module.training)
            return converted
        for name, child in module.named_children():
            module.add_module(name, cls.convert(child))
        return module

    def forward(self, x):
        if not self.training or self.local or not is_dist() or world_size() == 1:
            return super().forward(x)
        return _global_batch_norm(self, x, self.contributes)


def _global_batch_norm(layer, x, contributes=True):
    """BatchNorm `layer` in training on the statistics of every rank's `x` together (each channel's sums, then
    its centred squares, all-reduced differentiably); a rank that `contributes` nothing (its stand-in pass) adds
    zeros, joins the collectives and updates its running statistics as every other rank does."""
    all_reduce = _SummedOverRanks.apply
    weight = 1.0 if contributes else 0.0
    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1, -1] + [1] * (x.dim() - 2)
    sums = all_reduce(torch.cat([x.sum(dims), x.new_tensor([x.numel() / x.shape[1]])]) * weight)
    count = sums[-1]
    mean = sums[:-1] / count
    centred = x - mean.view(shape)
    var = all_reduce(centred.square().sum(dims) * weight) / count  # biased, as BatchNorm normalises with
    out = centred * torch.rsqrt(var + layer.eps).view(shape)
    if layer.affine:
        out = out * layer.weight.view(shape) + layer.bias.view(shape)
    if layer.track_running_stats:
        with torch.no_grad():
            layer.num_batches_tracked.add_(1)
            momentum = 1.0 / float(layer.num_batches_tracked) if layer.momentum is None else layer.momentum
            layer.running_mean.lerp_(mean.detach(), momentum)
            layer.running_var.lerp_(var.detach() * (count / (count - 1)).clamp_min(0), momentum)
    return out


# PyTorch 2.13 renamed broadcast_buffers (deprecated, and False also skipped the sync at construction)
# to forward_sync_buffers, which always syncs at construction; older versions know only the first.
_SYNC_BUFFERS = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                 else "broadcast_buffers")


def has_running_statistics(module):
    """Whether training changes some buffer of `module`: BatchNorm's (and SyncBatchNorm's) running
    statistics. Other buffers (positional tables, masks) are fixed functions of the configuration."""
    return any(getattr(m, "track_running_stats", False) and getattr(m, "running_mean", None) is not None
               for m in module.modules())


def wrap_ddp(module, device, sync_bn=False, find_unused=False):
    """(module to evaluate and save, module to train): `module` itself twice without a
    process group; else the (SyncBatchNorm-converted) module and its DDP wrapper (with `find_unused`:
    DDP's find_unused_parameters, for a model some of whose parameters take no part in training).

    DDP broadcasts rank 0's parameters and buffers at construction, so every rank starts equal;
    before every forward it broadcasts the buffers again only where training changes them (a
    Transformer's positional tables would cost ~10 MiB a step for nothing).
    """
    if not is_dist():
        return module, module
    if sync_bn:
        module = convert_sync_batchnorm(module, device)
    device_ids = [device.index] if device.type == "cuda" else None
    return module, DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=find_unused,
                                           **{_SYNC_BUFFERS: has_running_statistics(module)})



def ddp_module(model):
    """The DistributedDataParallel in `model` (itself, or under torch.compile), or None."""
    while model is not None and not isinstance(model, DistributedDataParallel):
        model = getattr(model, "_orig_mod", None)
    return model


def no_sync(model, skip=True):
    """With `skip`, DDP's no_sync(): forward + backward only accumulate local gradients and
    the all-reduce waits for a backward outside it. A no-op without DDP or with skip=False."""
    ddp = ddp_module(model) if skip else None
    return ddp.no_sync() if ddp is not None else contextlib.nullcontext()


@contextlib.contextmanager
def local_batch_norm(model, local=True):
    """With `local`, `model`'s SyncBatchNorm layers normalise with this rank's own batch statistics inside
    the block (plain BatchNorm's forward): no all_gather in forward. For a training step in which ranks
    run different numbers of forward passes (the short last global batch of an epoch), where
    SyncBatchNorm's gathers would not pair up across ranks. A no-op without SyncBatchNorm."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.SyncBatchNorm)] if local else []
    global_layers = [m for m in model.modules() if isinstance(m, GlobalBatchNorm)] if local else []
    for layer in layers:
        layer.forward = torch.nn.modules.batchnorm._BatchNorm.forward.__get__(layer)
    for layer in global_layers:
        layer.local = True
    try:
        yield model
    finally:
        for layer in layers:
            del layer.forward
        for layer in global_layers:
            del layer.local


def batch_norm_for_step(model, uneven, stand_in_somewhere):
    """How a training step's global BatchNorm layers normalise: each rank on its own batch when ranks run
    different numbers of forward passes (local_batch_norm); all-reduced, a stand-in rank adding nothing, when
    some rank has no window (batch_norm_beside_stand_in); else as they are."""
    if uneven:
        return local_batch_norm(model)
    return batch_norm_beside_stand_in(model, stand_in_somewhere)


@contextlib.contextmanager
def batch_norm_beside_stand_in(model, stand_in_somewhere=True):
    """Inside the block, `model`'s SyncBatchNorm layers normalise as GlobalBatchNorm does (all-reduced sums) on
    every rank, for a step in which some rank has no window and runs a stand-in pass (stand_in_batch_norm): its
    collectives then pair with theirs. A no-op without SyncBatchNorm or without a stand-in."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.SyncBatchNorm)] if stand_in_somewhere else []
    for layer in layers:
        layer.forward = functools.partial(_global_batch_norm, layer)
    try:
        yield model
    finally:
        for layer in layers:
            del layer.forward


@contextlib.contextmanager
def stand_in_batch_norm(model):
    """For a stand-in pass (a rank without a window in a short last step, its model in eval mode): its global
    BatchNorm layers train as the other ranks' do, joining their collectives but adding nothing, so every rank
    ends the step with the running statistics of exactly the step's windows, as one process has."""
    # not in a step whose layers normalise locally (local_batch_norm): there a stand-in must not train them
    layers = [m for m in model.modules() if (isinstance(m, GlobalBatchNorm) and not m.local) or (
        isinstance(m, torch.nn.SyncBatchNorm) and getattr(m.__dict__.get("forward"), "func", None) is _global_batch_norm)]
    for layer in layers:
        layer.train(True)
        if isinstance(layer, GlobalBatchNorm):
            layer.contributes = False
        else:
            layer.forward = functools.partial(_global_batch_norm, layer, contributes=False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.train(False)
            if isinstance(layer, GlobalBatchNorm):
                del layer.contributes
            else:
                layer.forward = functools.partial(_global_batch_norm, layer)


def make_optimizer(params, optimizer_class, shard=False, **options):
    """optimizer_class(params, **options); with `shard` and a process group, wrapped in
    ZeroRedundancyOptimizer: each rank keeps the state of its share of the parameters only."""
    if shard and is_dist():
        from torch.distributed.optim import ZeroRedundancyOptimizer  # a 1 s import: only when asked for

        zero = _scaled_zero(ZeroRedundancyOptimizer)(params, optimizer_class=optimizer_class, **options)
        # the local optimizer's fused kernel takes the GradScaler's scale and found_inf as device tensors
        zero._step_supports_amp_scaling = getattr(zero.optim, "_step_supports_amp_scaling", False)
        return zero
    return optimizer_class(params, **options)


def _scaled_zero(zero_class):
    """ZeroRedundancyOptimizer handing a GradScaler's on-device scale and found_inf to its local (fused)
    optimizer, as a fused Adam takes them (GradScaler.step sets them on the optimizer it is given, the
    wrapper): an overflowing step is then skipped inside the kernel, where a plain ZeRO made the scaler read
    found_inf back to the host every step (GradScaler._maybe_opt_step's .item())."""

    class ZeroRedundancyOptimizer(zero_class):  # torch's, named as torch's (what logs and tests see)
        def step(self, closure=None, **kwargs):
            given = [name for name in ("grad_scale", "found_inf") if hasattr(self, name)]
            for name in given:
                setattr(self.optim, name, getattr(self, name))
            try:
                return super().step(closure, **kwargs)
            finally:
                for name in given:
                    delattr(self.optim, name)

        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            if self.optim.defaults.get("fused"):  # ZeRO's load puts 0-dim state (Adam's step) on the CPU; the
                # fused kernel takes it beside its parameter, where a fused Adam's own load keeps it
                for param, state in self.optim.state.items():
                    for name, value in state.items():
                        if torch.is_tensor(value) and value.dim() == 0 and value.device != param.device:
                            state[name] = value.to(param.device)

    return ZeroRedundancyOptimizer


def _is_sharded(optimizer):
    return hasattr(optimizer, "consolidate_state_dict")  # ZeroRedundancyOptimizer, not imported eagerly


def optimizer_state_dict(optimizer):
    """The full optimizer state on rank 0 (None elsewhere). A collective for a sharded
    optimizer, whose shards are first gathered on rank 0: call it on every rank."""
    if _is_sharded(optimizer):
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if is_main() else None


def load_optimizer_state(optimizer, state):
    """Load a full optimizer state into a plain or a sharded optimizer, whichever saved it.

    The saved kernel choice (fused / foreach) is replaced by this optimizer's own, so a
    state written with --zero loads without it and vice versa.
    """
    for saved, current in zip(state["param_groups"], optimizer.param_groups):
        for key in ("fused", "foreach"):
            if key in current:
                saved[key] = current[key]
    optimizer.load_state_dict(state)
    if _is_sharded(optimizer):
        # Its load also copies this rank's shard into the wrapper's own `state`, which
        # nothing reads (the local optimizer holds the live copy): drop the duplicate.
        optimizer.state.clear()


def optimizer_state_bytes(optimizer):
    """Bytes of optimizer state tensors held by this rank (only its shard when sharded)."""
    states = [optimizer.state] + ([optimizer.optim.state] if _is_sharded(optimizer) else [])
    return sum(value.numel() * value.element_size() for state in states for per_param in state.values()
               if per_param for value in per_param.values() if torch.is_tensor(value))
