"""This process as a launcher's worker: what it takes from whatever started it (torchrun's agent,
utils.launch, srun) and what it tells it back.

Under torchrun, a worker dies with its launcher (die_with_launcher), tells utils.launch that it printed
a user error's line (the launcher line file), and asks its agent to end the job on a user error
(USER_ERROR_SIGNAL) instead of restarting into it. Under srun, a task becomes the worker torchrun would
have started (slurm_task_variables, adopt_slurm_task).
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from utils.distributed import env_rank, launched_by_torchrun, local_rank
from utils.errors import UserError


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
