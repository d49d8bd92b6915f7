"""Atomic file writes: every file this codebase writes goes through `atomic_write`.

A crash or a kill mid-write leaves the previous file (or none), never half of one.
"""
import contextlib
import fcntl
import functools
import os
import socket
import tempfile
import time

TEMP_PREFIX = ".tmp_"


def current_umask():
    """The process's umask, read without changing it: os.umask can only read it by setting it, and a
    thread creating a file meanwhile would get the wrong mode. Linux shows it in /proc/self/status."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _umask_by_setting_it()


@functools.lru_cache(maxsize=None)
def _umask_by_setting_it():
    """Where /proc does not tell (not Linux): set and restore it, once."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def open_mode():
    """The mode open() gives a new file: 0o666 less the umask."""
    return 0o666 & ~current_umask()


def file_version(stat):
    """A file's version as an os.stat result tells it: (inode, mtime, size); a rewrite or a replacement moves it."""
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def file_versions(folder):
    """{name: (inode, mtime, size)} of the plain files in `folder` ({} if it is not there): what give_open_mode
    compares with."""
    if not os.path.isdir(folder):
        return {}
    return {entry.name: file_version(entry.stat(follow_symlinks=False)) for entry in os.scandir(folder)
            if entry.is_file(follow_symlinks=False)}


def give_open_mode(folder, before):
    """Give every plain file of `folder` that is new or rewritten since `before` (file_versions) the mode
    open() would have given it: writers of other packages pick modes of their own (safetensors' save_file
    makes its files 0o600 whatever the umask), and a release folder is often shared between users."""
    mode = open_mode()
    for name, version in file_versions(folder).items():
        if before.get(name) != version:
            os.chmod(os.path.join(folder, name), mode)


def atomic_write(path, write, binary=True):
    """Call write(f) on a temp file in `path`'s folder, fsync it, then rename it over `path`. The file
    gets the mode open() would give it (0o666 less the umask), not mkstemp's private 0o600."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=TEMP_PREFIX, suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            os.fchmod(f.fileno(), open_mode())
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as failure:
        if os.path.exists(tmp):
            os.remove(tmp)
        first = _what_stopped_the_write(failure)
        if first is not failure:
            raise first from None
        raise
    return path


def _what_stopped_the_write(failure):
    """The failure that stopped a write, under the writer's own clean-up error. torch.save's zip writer
    meets a failed write (a full disk: ENOSPC; past RLIMIT_FSIZE: EFBIG) or a signal (SIGTERM, Ctrl-C)
    mid-write, then fails again finishing the half-written archive, with a RuntimeError ('unexpected pos
    ...') whose context is the first failure: that one is what happened, and what callers catch (OSError)."""
    if not isinstance(failure, Exception) or isinstance(failure, OSError):
        return failure
    first = failure.__context__
    while first is not None:
        if not isinstance(first, Exception) or isinstance(first, OSError):
            return first
        first = first.__context__
    return failure


def append_line(path, line):
    """Append `line` to a text file (made with open()'s mode) on a line of its own, even after a cut-off last
    line (a run killed in its append: gluing onto it would spoil this record too), whole or not at all: a write
    that fails part-way (a full disk) is cut back off, so the file holds what it held. Appenders take turns
    (an exclusive flock), so cutting back never takes another run's record with it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        end = os.lseek(fd, 0, os.SEEK_END)
        cut_off = end > 0 and os.pread(fd, 1, end - 1) != b"\n"
        data = memoryview((("\n" if cut_off else "") + line + "\n").encode())
        try:
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)  # where the disk reports it only now (NFS), a full disk fails here, still cut back
        except BaseException:
            os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)  # and with it the lock


def remove_stale_temporaries(folder, older_than):
    """Remove the temp files atomic_write left in `folder` (a process SIGKILLed mid-write) that were
    last written before `older_than` (a time.time()); the names removed. The caller must be the
    folder's only writer (utils.checkpoint.setting_lock), so no live write is touched."""
    removed = []
    for entry in os.scandir(folder) if os.path.isdir(folder) else ():
        if entry.name.startswith(TEMP_PREFIX) and entry.is_file() and entry.stat().st_mtime < older_than:
            try:
                os.remove(entry.path)
                removed.append(entry.name)
            except FileNotFoundError:
                pass
    return removed


def same_file(path, fd):
    """Whether `path` still names the file open as `fd` (not removed, not replaced by another)."""
    try:
        named, held = os.stat(path), os.fstat(fd)
    except OSError:  # gone, or a file now stands where a folder of its path was
        return False
    return (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev)


def take_file_lock(path):
    """An exclusive flock on `path` (created if missing), with this process's pid, host and start time
    written in: (its open fd, None), or (None, what the file says of the process that holds it). The
    kernel drops the lock when its holder dies, so a killed holder never blocks the next taker."""
    tries = 0
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 500).decode(errors="replace").strip() or "a process that is starting"
            os.close(fd)
            tries += 1
            if tries < 5:  # lock_holder's probe holds it for microseconds: not a holder to refuse for
                time.sleep(0.02)
                continue
            return None, holder
        if same_file(path, fd):  # else its holder removed it between our open and our lock: take the new one
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
    return fd, None


def lock_holder(path):
    """What the lock file of take_file_lock at `path` says of the process holding it, or None if no process
    holds it (or there is no such file). Creates nothing and takes nothing: a shared flock tried and let go
    at once (take_file_lock tries again meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 500).decode(errors="replace").strip() or "a process that is starting"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def release_file_lock(path, fd):
    """Remove the lock file of take_file_lock while still holding it (an opener waiting on it sees it
    replaced), unless it is no longer this one (its folder removed and a new taker's file in its place),
    then let go of it."""
    if same_file(path, fd):
        with contextlib.suppress(OSError):
            os.unlink(path)
    os.close(fd)
