"""Shared test helpers: run the CLI as a user would, and run functions on several gloo ranks."""
import hashlib
import json
import os
import queue as queue_module
import re
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path

import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
ETTH1 = REPO.parent / "shared" / "datasets" / "ETT-small" / "ETTh1.csv"
EXCHANGE = REPO.parent / "shared" / "datasets" / "exchange_rate" / "exchange_rate.txt.gz"
# A TimerXL small enough for CPU tests (dropout 0.1 stays on, so RNG state matters).
SMALL_TIMERXL = ["--model", "TimerXL", "--d_model", 32, "--d_ff", 64, "--n_heads", 2, "--e_layers", 1]
ETTH1_ARGS = ["--data", "ETTh1", "--root_path", str(ETTH1.parent), "--data_path", ETTH1.name]


def write_etth1_shaped(folder):
    """An ETTh1-shaped file (20 months of hours, the ETT columns) at folder/ETTh1.csv: the real one may
    be absent, and ETTh1's fixed split borders need exactly this length."""
    from data_provider.synthetic import make_synthetic

    frame = make_synthetic(rows=14400, channels=7, seed=1)
    frame.columns = ["date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "ETTh1.csv", index=False)
    return folder


def _this_interpreter_first(path):
    """`path` with a folder first whose `python` is the interpreter running the tests: a script a test starts
    (`bash scripts/ddp_forecast.sh` calls `python`) runs with it, whatever `python` PATH names otherwise
    (a virtual environment not activated, another Python first on PATH)."""
    tag = hashlib.sha1(sys.executable.encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"tsl-test-python-{os.getuid()}-{tag}"
    folder.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        link = folder / name
        if not (link.is_symlink() and os.readlink(link) == sys.executable):
            spare = folder / f".{name}-{uuid.uuid4().hex}"  # made aside and renamed: two suites may race here
            spare.symlink_to(sys.executable)
            os.replace(spare, link)
    return os.pathsep.join([str(folder), *filter(None, path.split(os.pathsep))])


def subprocess_env():
    """The environment of a process a test starts: this one's, its `python` the running interpreter, unbuffered,
    one thread, and no variable of a launcher that started the suite itself."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PATH=_this_interpreter_first(os.environ.get("PATH", "")))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    for name in [n for n in env if n.startswith("SLURM_")]:  # a suite run inside a SLURM job: no task of it
        env.pop(name)
    return env


def output_args(folder):
    """--checkpoints and --results_dir inside `folder`, where run_cli puts them and records() reads."""
    return ["--checkpoints", folder / "checkpoints", "--results_dir", folder / "results"]


def run_cli(tmp_path, *args, nproc=None, timeout=240, outputs=True, plots=False, fresh=False, preempt_at_step=None,
            extra_env=None):
    """`python run.py ...`, or with `nproc` workers as torchrun starts them. Returns CompletedProcess.
    Pictures are skipped (--no_plots) unless `plots`: drawing them costs about a second.

    By default the processes are forked from a warm interpreter (see `fork_run_py`), which runs
    run.py exactly as `python run.py` does but skips the ~5 s of imports each process pays;
    `fresh` starts real interpreters (and the real torchrun agent), as tests of the launcher need.
    `preempt_at_step`: every process SIGKILLs itself as it starts that optimizer step (forked runs only).
    `extra_env`: variables set in every forked process, over those a launcher gives (forked runs only)."""
    argv = [*map(str, args)] + ([] if plots else ["--no_plots"])
    if outputs:
        argv += map(str, output_args(tmp_path))
    if not fresh:
        return fork_run_py(argv, nproc=nproc, timeout=timeout, preempt_at_step=preempt_at_step, extra_env=extra_env)
    assert extra_env is None, "extra_env is for forked runs"
    cmd = [sys.executable]
    if nproc is not None:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.run(cmd + [str(REPO / "run.py"), *argv], cwd=REPO, env=repo_first_env(subprocess_env()),
                          capture_output=True, text=True, timeout=timeout)


def repo_first_env(env):
    """`env` with this checkout's root first on PYTHONPATH: a process started with it imports this
    repository's code, not an installed copy or another checkout's."""
    paths = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(env, PYTHONPATH=os.pathsep.join(paths))


def project_imported_elsewhere():
    """The first project module this process holds from outside REPO, as 'name (file)', or None."""
    for name in ("run", "exp", "utils", "data_provider", "models", "layers"):
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin and not Path(origin).resolve().is_relative_to(REPO):
            return f"{name} ({origin})"
    return None


# What every run.py process imports (torch._dynamo comes with the first optimizer): loaded once
# in the fork server, so each forked run starts warm.
# chronos.chronos_bolt brings transformers (about 3 s a process): the foundation models' CLI tests fork warm too; tirex2 (its
# class-level torch.compile brings TorchInductor: about 3 s)
WARM_MODULES = ["run", "exp.exp_forecast", "exp.outputs", "torch._dynamo", "sklearn.preprocessing", "pandas",
                "chronos.chronos_bolt", "tirex2"]
_fork_context = None


def warm_context():
    """multiprocessing's forkserver, its server holding WARM_MODULES: children fork from it in
    milliseconds. It starts with one thread per library (OMP_NUM_THREADS=1), so forking is safe.

    The server imports WARM_MODULES by name with its own sys.path (Python 3.11 does not pass it the
    parent's): its working directory first, then PYTHONPATH, then an installed copy. Started in REPO with
    REPO first on PYTHONPATH, it holds this checkout's code wherever pytest was started."""
    global _fork_context
    if _fork_context is None:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(WARM_MODULES)
        saved, cwd = dict(os.environ), os.getcwd()
        os.environ.update(repo_first_env(saved), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        os.chdir(REPO)
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(saved)
        _fork_context = context
    return _fork_context


def _preempt_at_step(step):
    """Make this process SIGKILL itself as it starts optimizer step `step` (1-based): a preemption at
    an exact point, after everything the previous step saved is on disk (saves end in a collective)."""
    from exp.exp_forecast import Exp_Forecast

    train_step, taken = Exp_Forecast.train_step, [0]

    def preempted(self, micro_batches, optimizer):
        taken[0] += 1
        if taken[0] == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return train_step(self, micro_batches, optimizer)

    Exp_Forecast.train_step = preempted


def _run_py_child(argv, env, stdout_path, stderr_path, preempt_at_step=None):
    """In a forked child: become `python run.py argv` with `env`, streams to the two files (killed
    at the start of optimizer step `preempt_at_step`, if given)."""
    if preempt_at_step is not None:
        _preempt_at_step(preempt_at_step)
    os.chdir(REPO)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    elsewhere = project_imported_elsewhere()
    if elsewhere:  # the fork server holds another checkout's modules: say so rather than test that code
        print(f"tests/helpers: the fork server imported {elsewhere}, not the code under {REPO}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)
    sys.argv = ["run.py", *argv]
    code = 1
    try:
        runpy.run_path(str(REPO / "run.py"), run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _read_if_there(path):
    """A child's stream; empty when it died before opening it."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def fork_run_py(argv, nproc=None, timeout=240, preempt_at_step=None, extra_env=None):
    """run.py with `argv` in a process forked from the warm server, or `nproc` of them with the
    environment torchrun gives its workers (ranks, local world, master address, run id).

    Like torchrun's agent, once one process fails the others are stopped. Returns a CompletedProcess:
    stdout and stderr are rank 0's followed by the others', the return code is 0 when every process
    ended 0, else the first failure's (the agent would exit 1 with a summary of its own; tests of the
    agent use fresh interpreters).
    """
    context = warm_context()
    env = subprocess_env()
    workers = []
    if nproc is not None:
        port, run_id = free_port(), uuid.uuid4().hex
        for rank in range(nproc):
            workers.append(dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                                LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", ROLE_RANK=str(rank),
                                ROLE_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0",
                                TORCHELASTIC_MAX_RESTARTS="0"))
    else:
        workers.append(env)
    workers = [dict(worker, **(extra_env or {})) for worker in workers]
    with tempfile.TemporaryDirectory() as folder:
        streams = [(os.path.join(folder, f"{rank}.out"), os.path.join(folder, f"{rank}.err"))
                   for rank in range(len(workers))]
        processes = [context.Process(target=_run_py_child, args=(argv, worker_env, *paths, preempt_at_step))
                     for worker_env, paths in zip(workers, streams)]
        for process in processes:
            process.start()
        first_failure = _wait_like_torchrun(processes, timeout)
        late = [p for p in processes if p.is_alive()]
        for process in late:
            process.kill()
            process.join()
        out = "".join(_read_if_there(path) for path, _ in streams)
        err = "".join(_read_if_there(path) for _, path in streams)
    cmd = ["run.py", *argv]
    if late:
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
    return subprocess.CompletedProcess(cmd, 0 if first_failure is None else first_failure.exitcode, out, err)


def _wait_like_torchrun(processes, timeout):
    """Wait for every process, or, as torchrun's agent does, stop the others (SIGTERM) once one ends
    non-zero; the first to fail, or None. Processes still running at the deadline are left running."""
    deadline = time.monotonic() + timeout
    first_failure = None
    while time.monotonic() < deadline and any(p.is_alive() for p in processes):
        failed = [p for p in processes if p.exitcode not in (None, 0)]
        if failed and first_failure is None:
            first_failure = failed[0]
            for process in processes:
                if process.is_alive():
                    process.terminate()
        time.sleep(0.02)
    return first_failure or next((p for p in processes if p.exitcode not in (None, 0)), None)


def run_command(cmd, timeout=240, extra_env=None):
    env = subprocess_env()
    for name, value in (extra_env or {}).items():  # None: the variable unset
        env.pop(name, None) if value is None else env.__setitem__(name, value)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def records(tmp_path):
    """Every record appended to results.jsonl, oldest first."""
    path = tmp_path / "results" / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def assert_one_error_line(proc, message):
    """run.py refused: exit code 2, exactly one `error:` line and it holds `message` (under the launcher too:
    no summary of its own, none of torchrun's log lines), no traceback anywhere."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert len(errors) == 1 and message in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert not TORCHRUN_LOG_LINE.search(proc.stderr), proc.stderr[-3000:]


# "W1127 11:32:24.069000 5457 site-packages/torch/distributed/run.py:874] ...": torchrun's logging
TORCHRUN_LOG_LINE = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ \S*torch/distributed/\S+\] ", re.M)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank, world_size, port, fn, args, queue):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        queue.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()
        # skip interpreter teardown, where gloo threads can abort a finished rank (see
        # utils.distributed.exit_process); flush the queue's feeder thread first
        queue.close()
        queue.join_thread()
        os._exit(0)


def run_on_ranks(fn, world_size, *args, timeout=120):
    """Run fn(rank, world_size, *args) on `world_size` gloo processes; list of results by rank.

    fn must be a module-level function (it is pickled by reference)."""
    queue = warm_context().Queue()
    ctx_procs = mp.start_processes(_rank_entry, args=(world_size, free_port(), fn, args, queue),
                                   nprocs=world_size, join=False, start_method="forkserver")
    results = {}
    for _ in range(world_size):
        try:
            rank, ok, value = queue.get(timeout=timeout)
        except queue_module.Empty:
            ok, value = False, f"no answer within {timeout} s (a hang?)"
            rank = next(r for r in range(world_size) if r not in results)
        if not ok:
            for process in ctx_procs.processes:
                process.kill()
            raise AssertionError(f"rank {rank} failed:\n{value}")
        results[rank] = value
    while not ctx_procs.join(timeout=timeout):
        pass
    return [results[r] for r in range(world_size)]


def make_args(*argv):
    """Parsed run.py arguments with the defaults other arguments decide (exp.settings.fill_defaults),
    as the data functions read them; make_experiment resolves the rest.

    Each value is a new string object, as sys.argv's are: a test file's literal "MS" is interned and
    `args.features is "MS"` would hold for it, hiding an `is` that fails under run.py."""
    from exp.settings import fill_defaults
    from utils.arguments import parse_args

    return fill_defaults(parse_args([str(a).encode().decode() for a in argv]))


def make_experiment(args):
    """Exp_Forecast as run.py builds it: `args` resolved in place for this process group's size,
    on the device utils.distributed.setup gives (a test's own process group is already there)."""
    from exp.exp_forecast import Exp_Forecast
    from exp.settings import resolve_args
    from utils import distributed

    resolve_args(args, distributed.world_size())
    return Exp_Forecast(args, distributed.setup(args.ddp, args.use_gpu, args.gpu, args.dist_timeout, args.num_threads))


def one_accumulated_step(argv, batch_size):
    """An experiment from `argv` takes one train_step over the training split's first two micro-batches of
    `batch_size` windows; returns (weights after the step, each parameter's .grad or None)."""
    import torch
    from data_provider.data_factory import data_provider

    exp = make_experiment(make_args(*argv))
    dataset, _ = data_provider(exp.args, "train", exp.device)
    micro_batches = [dataset.__getitems__(torch.arange(i * batch_size, (i + 1) * batch_size)) for i in range(2)]
    optimizer = exp.make_optimizer()
    exp.model.train()
    exp.train_step(micro_batches, optimizer)
    # train_step zeroes gradients before its group, so .grad holds the whole step's gradient
    weights = {name: p.detach().clone() for name, p in exp.raw_model.named_parameters()}
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in exp.raw_model.named_parameters()}
    return exp.device, weights, grads


def assert_compiled_gradients_equal_eager(argv, batch_size, label):
    """The same experiment with and without --compile (dropout 0 and learning rate 0 in `argv`): equal
    starting weights, and every parameter's accumulated .grad agrees (rtol 1e-4, atol 1e-6)."""
    import torch

    _, eager_weights, eager = one_accumulated_step(argv, batch_size)
    device, compiled_weights, compiled = one_accumulated_step([*argv, "--compile"], batch_size)
    assert sorted(compiled) == sorted(eager)
    for name, weight in eager_weights.items():  # the same start (and learning rate 0 kept it)
        assert torch.equal(compiled_weights[name], weight), name
    assert any(g is not None and g.abs().max() > 0 for g in eager.values()), "no gradient at all"
    for name, grad in eager.items():
        assert (compiled[name] is None) == (grad is None), f"{name}: a gradient on one side only"
        if grad is not None:
            torch.testing.assert_close(compiled[name], grad, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, name=name: f"{label} {name}: {m}")
    return device


class Streamed:
    """A process whose output is collected line by line while it runs."""

    def __init__(self, cmd, env=None):
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env or subprocess_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"never saw {text!r}:\n{''.join(self.lines)[-3000:]}")

    def finish(self, timeout=240):
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.proc.returncode, "".join(self.lines)


def _worker_pids(launcher_pid):
    """Worker processes started by torchrun's agent, as {local_rank: pid}."""
    workers = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher_pid:
            for item in environ:
                if item.startswith(b"LOCAL_RANK="):
                    workers[int(item.split(b"=")[1])] = int(entry.name)
    return workers


def kill_a_worker_before(start, line, not_saved_yet, attempts=3, settle_s=1.0):
    """Start a DDP run (`start(attempt)` -> Streamed), SIGSTOP its local rank 1 at `line`, give the others
    `settle_s` to finish what was under way, and SIGKILL the frozen worker once `not_saved_yet(attempt)`
    confirms the save the test wants to precede has not happened. With one rank frozen nothing that needs
    every rank (a step, a validation, the save after it) completes, so where the kill lands is read from disk,
    not timed. A stalled test process can read `line` only after that save: such an attempt cannot test the
    restart, so it is ended and started afresh (a new folder each attempt). Returns (the run, its attempt)."""
    for attempt in range(attempts):
        run = start(attempt)
        run.wait_for(line)
        victim = _worker_pids(run.proc.pid)[1]
        os.kill(victim, signal.SIGSTOP)
        time.sleep(settle_s)
        if not_saved_yet(attempt):
            os.kill(victim, signal.SIGKILL)
            return run, attempt
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.finish()
    raise AssertionError(f"in {attempts} attempts the save always came before {line!r} was read")


def trained_on_1_and_2_processes(tmp_path, *argv):
    """`run.py argv` trained on 1 process and on 2 (--ddp), each in a folder of its own: for each, its record
    and its checkpoint.pth (path, state_dict), for tests that the same global batch trains the same weights."""
    import torch

    runs = []
    for nproc in (None, 2):
        folder = tmp_path / f"nproc{nproc or 1}"
        assert_ok(run_cli(folder, *argv, *(["--ddp"] if nproc else []), nproc=nproc))
        record = records(folder)[-1]
        path = folder / "checkpoints" / record["setting"] / "checkpoint.pth"
        runs.append((record, path, torch.load(path, map_location="cpu", weights_only=True)))
    return runs

