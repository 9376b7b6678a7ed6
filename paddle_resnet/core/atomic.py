"""Writing files so that a crash never leaves a half-written one where a good one was.

A folder is replaced in three steps (``staged_directory``): the new content is written
and synced in a hidden sibling ``.<name>.partial-<host>-<pid>``; the old folder is renamed
to ``.<name>.retired-<host>-<pid>``; the new one is renamed into place and the retired one
removed. A process killed at any point leaves hidden folders that ``recover_staged`` (run
before every save and every read) resolves: a retired folder means the new one was
complete; a partial folder alone is an interrupted write and is removed. A folder is
removed the same way (``remove_directory``): renamed to ``.<name>.removed-<host>-<pid>``
first, never half-deleted under its own name.

Whether another host's writer is alive is read from its lock (an exclusive ``flock`` on
``.<name>.lock-<host>-<pid>``, which the kernel or the network file system's lock manager
releases when the process dies), so a job restarted on another node finishes what the
dead node's process left. A file system that takes no locks ends the run at its first
lock with one line naming it (``_flock``).
"""

import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket

from paddle_resnet.core.errors import LOCK_ERRORS, UserError, os_error_is_users, os_error_reason

_LEFTOVER = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>partial|retired|removed|lock)-(?P<host>.+)-(?P<pid>\d+)$"
)


@contextlib.contextmanager
def atomic_files(*paths):
    """Binary handles on temporaries that replace ``paths`` only if the block succeeds."""
    os.makedirs(os.path.dirname(os.path.abspath(paths[0])), exist_ok=True)
    temporaries = [path + ".tmp" for path in paths]
    try:
        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(open(temporary, "wb")) for temporary in temporaries]
    except BaseException:
        for temporary in temporaries:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
        raise
    for temporary, path in zip(temporaries, paths):
        os.replace(temporary, path)


def check_writable_folder(path, what):
    """Create ``path`` if needed and prove a file can be written there; UserError naming
    ``what`` (the flag) and the cause otherwise. Run before work that would be lost."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{what} {path}: is a file, not a folder")
    probe = os.path.join(path, f".write-test-{_owner()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"0")
        os.remove(probe)
    except OSError as err:
        if not os_error_is_users(err):  # an I/O error of the file system
            raise
        raise UserError(f"{what} {path}: cannot write there ({os_error_reason(err)})") from None


def _fsync_dir(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# flock's answers on a file system that cannot lock: ENOLCK (NFS without its lock manager),
# EOPNOTSUPP / ENOSYS (Lustre mounted without flock, FUSE), and from flock alone EINVAL
# (some of both; too broad for the exit-status table's user errors)
_NO_LOCKS = LOCK_ERRORS | {errno.EINVAL}


def mount_of(path):
    """(mount point, type, options) of ``path``'s file system from /proc/mounts, or None."""
    try:
        with open("/proc/mounts") as handle:
            entries = [line.split() for line in handle]
    except OSError:
        return None
    target = os.path.realpath(path)
    best = None
    for fields in entries:
        if len(fields) < 4:
            continue
        # /proc/mounts escapes spaces, tabs, newlines and backslashes as octal
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2], fields[3])
    return best


def _flock(descriptor, operation, path):
    """``fcntl.flock``; a file system that cannot lock is a UserError naming it and what to do."""
    try:
        fcntl.flock(descriptor, operation)
    except OSError as err:
        if err.errno not in _NO_LOCKS:  # a lock held by another (BlockingIOError) too
            raise
        mount = mount_of(os.path.dirname(os.path.abspath(path)))
        where = f"{mount[1]} at {mount[0]}, mounted {mount[2]}" if mount else "unknown"
        raise UserError(
            f"{path}: the file system ({where}) cannot take a lock (flock: "
            f"{err.strerror}), which a run holds on its folders: mount it with locks "
            "(Lustre: -o flock; NFS: without nolock, with its lock manager running) or "
            "choose a folder on a file system that takes them"
        ) from None


def _owner():
    return f"{socket.gethostname()}-{os.getpid()}"


def _hidden(directory, kind, owner):
    parent, name = os.path.split(os.path.abspath(directory))
    return os.path.join(parent, f".{name}.{kind}-{owner}")


def _holds_lock(lock_path):
    """True while a live process holds the writer's lock at ``lock_path``."""
    try:
        descriptor = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False  # never locked (an older version), or released
    try:
        _flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, lock_path)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # closing releases a lock taken just now
    return False


def _process_alive(pid):
    """Whether a process ``pid`` of this host (this process's PID namespace) exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _owner_alive(parent, leftover):
    """Whether the writer of ``leftover`` (a ``_LEFTOVER`` match) is alive: its pid, or its lock."""
    host, pid = leftover["host"], int(leftover["pid"])
    if host != socket.gethostname():
        return _holds_lock(os.path.join(parent, f".{leftover['name']}.lock-{host}-{pid}"))
    if pid == os.getpid():
        return False  # our own leftovers from an earlier failure
    return _process_alive(pid)


def recover_staged(parent):
    """Finish or undo what dead processes' replacements left in ``parent``; a line each."""
    if not os.path.isdir(parent):
        return []
    actions = []
    for entry in sorted(os.listdir(parent)):
        match = _LEFTOVER.match(entry)
        if not match or match["kind"] != "retired" or _owner_alive(parent, match):
            continue
        owner = f"{match['host']}-{match['pid']}"
        target = os.path.join(parent, match["name"])
        retired, staged = os.path.join(parent, entry), _hidden(target, "partial", owner)
        if not os.path.exists(target):
            # Killed between the two renames: the staged folder was complete.
            os.replace(staged if os.path.isdir(staged) else retired, target)
            actions.append(f"{target}: completed an interrupted replacement")
        shutil.rmtree(retired, ignore_errors=True)
    for entry in sorted(os.listdir(parent)):
        match = _LEFTOVER.match(entry)
        if not match or _owner_alive(parent, match):
            continue
        path = os.path.join(parent, entry)
        if match["kind"] == "lock":
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        what = "removal" if match["kind"] == "removed" else "write"
        actions.append(f"{path}: finished an interrupted {what}")
    return actions


def remove_directory(directory):
    """Remove ``directory``, renamed out of sight first: no process sees it half-deleted."""
    parent = os.path.dirname(os.path.abspath(directory))
    removed = _hidden(directory, "removed", _owner())
    os.replace(directory, removed)
    _fsync_dir(parent)
    shutil.rmtree(removed)


@contextlib.contextmanager
def _writer_lock(directory):
    """The lock telling processes on any host that this one is replacing ``directory``."""
    path = _hidden(directory, "lock", _owner())
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _flock(descriptor, fcntl.LOCK_EX, path)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.close(descriptor)


@contextlib.contextmanager
def staged_directory(directory):
    """A hidden sibling to fill, which replaces ``directory`` by renames if the block succeeds."""
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    recover_staged(parent)
    with _writer_lock(directory):
        staging = _hidden(directory, "partial", _owner())
        os.makedirs(staging)
        try:
            yield staging
            for folder, _, names in os.walk(staging):  # files and subfolders alike
                for name in names:
                    with open(os.path.join(folder, name), "rb+") as handle:
                        os.fsync(handle.fileno())
                _fsync_dir(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if os.path.exists(directory):
            retired = _hidden(directory, "retired", _owner())
            os.replace(directory, retired)
            os.replace(staging, directory)
            shutil.rmtree(retired)
        else:
            os.replace(staging, directory)
        _fsync_dir(parent)


RUN_LOCK = ".run.lock"


@contextlib.contextmanager
def held_by_this_run(lock_path, what):
    """Hold ``lock_path`` (an exclusive ``flock``, its content "<host> pid <pid>") while the
    block runs: one run per folder, a second refused in one line naming the holder. The file
    stays (removing it would let two processes lock two files)."""
    os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            _flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, lock_path)
        except BlockingIOError:
            with open(lock_path) as handle:
                raise UserError(_in_use(what, lock_path, handle.read().strip())) from None
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{socket.gethostname()} pid {os.getpid()}\n".encode())
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _in_use(what, lock_path, holder):
    """The line refusing ``what``, whose lock ``lock_path`` another process holds (its
    content ``holder``: "<host> pid <pid>", or empty before the holder wrote it). A holder
    on another host may be dead, and no host can prove it (NFS keeps a dead client's lock
    until its lease ends, Lustre until it is evicted): the line says how to take the folder
    over by hand, removing the file (the next run locks a new one, which the dead holder's
    lock does not cover)."""
    host, _, pid = holder.partition(" pid ")
    if not pid.isdigit():
        return (
            f"{what} is in use by another process (it holds {lock_path} until it ends): "
            "wait for it, or choose another folder"
        )
    if host == socket.gethostname() and _process_alive(int(pid)):
        return (
            f"{what} is in use by a run on {holder} (it holds {lock_path} until it ends): "
            f"wait for it (or stop it: kill {pid}), or choose another folder"
        )
    return (
        f"{what} is in use by a run on {holder} (it holds {lock_path} until it ends): wait "
        f"for it, or choose another folder. If that run is gone ({host} down or cut off: "
        "the file server keeps a lost host's lock until its lease ends or it restarts, and "
        f"this host cannot prove it), take the folder over with: rm {lock_path}"
    )


def run_lock(folder, what):
    return held_by_this_run(os.path.join(folder, RUN_LOCK), what)


def export_lock(directory, what):
    """``held_by_this_run`` for a folder replaced as a whole (an export): a hidden sibling."""
    parent, name = os.path.split(os.path.abspath(directory))
    return held_by_this_run(os.path.join(parent, f".{name}.export.lock"), what)
