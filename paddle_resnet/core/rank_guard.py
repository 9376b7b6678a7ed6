"""A watcher process beside each rank of ``paddle.distributed.launch``: it ends the rank
when its launcher is gone, or when the start (everything before the first training step)
passes its deadline, even while the rank's main thread is blocked in Paddle's C++ with
the GIL held, where no thread of the rank could run (seen: ``TCPStore.get``, gloo's and
NCCL's rendezvous).

The rank starts it (``RankGuard``) and tells it through a pipe which phase of the start
it is in, when the start is over, when its run has finished and when it is over; the
watcher writes one line naming the rank, the phase and the cause into the rank's log and
ends the rank and what it forked with SIGKILL: a crash that a restart may fix (the
launcher reports 247). It also ends what a rank forked once the rank has ended.

The teardown after the run has a grace (``teardown_seconds``: PADDLE_RESNET_TEARDOWN_SECONDS,
300 s unless set; 0: none). A rank whose run ended by an error or a stop and is still alive
then is ended by the watcher. A rank whose run finished must not turn its status 0 into a
crash that schedulers requeue: it ends itself at the grace with status 0 (``exit_at``: a
thread of the C library, which needs no GIL, so it works while Paddle's C++ holds it).

Standard library only: the watcher runs this file with ``python -I -S``, without Paddle
or the package (``python -I -S rank_guard.py RANK_PID LAUNCHER_PID RANK TIMEOUT TEARDOWN``).
"""

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

POLL_SECONDS = 0.5
TEARDOWN_VARIABLE = "PADDLE_RESNET_TEARDOWN_SECONDS"
# A rank's teardown after its run, at most: Paddle's and DALI's took 2 s and more, and an
# interpreter's exit waits for every thread a library left running (a tracker's upload).
# Generous: a run that finished ends with status 0 at the grace all the same.
TEARDOWN_SECONDS = 300
# How long past its grace a finished rank may still be seen alive before the watcher ends
# it (``exit_at`` failed to arm): the watcher polls every POLL_SECONDS.
EXIT_MARGIN_SECONDS = 10


def teardown_seconds(environ=os.environ):
    """The teardown grace: PADDLE_RESNET_TEARDOWN_SECONDS, else TEARDOWN_SECONDS; ValueError
    naming the variable for a value that is not a number of seconds >= 0."""
    value = environ.get(TEARDOWN_VARIABLE, "")
    if not value:
        return float(TEARDOWN_SECONDS)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(
            f"{TEARDOWN_VARIABLE}={value}: not a number of seconds >= 0 (the teardown's grace "
            f"after a run; 0: none; unset: {TEARDOWN_SECONDS})"
        )
    return seconds


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):  # Linux's struct sigevent: 64 bytes
    _fields_ = [
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("sigev_notify_function", ctypes.c_void_p),
        ("sigev_notify_attributes", ctypes.c_void_p),
        ("padding", ctypes.c_char * 32),
    ]


_SIGEV_THREAD, _CLOCK_MONOTONIC, _TIMER_ABSTIME = 2, 1, 1


def exit_at(deadline):
    """End this process with status 0 at ``deadline`` (``time.monotonic()``'s clock), from
    a thread that the C library starts then to call ``_exit(0)`` (a POSIX timer, notify
    SIGEV_THREAD: the function gets the timer's value, 0): no Python runs, so no GIL is
    needed. Whether it is armed (False off glibc's Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        event = _Sigevent(sigev_value=None, sigev_notify=_SIGEV_THREAD)
        event.sigev_notify_function = ctypes.cast(libc["_exit"], ctypes.c_void_p).value
        timer = ctypes.c_void_p()
        if libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)):
            return False
        seconds = int(deadline)
        when = _Itimerspec(it_value=_Timespec(seconds, int((deadline - seconds) * 1e9)))
        return libc.timer_settime(timer, _TIMER_ABSTIME, ctypes.byref(when), None) == 0
    except (OSError, AttributeError):  # no C library to ask, or no POSIX timers in it
        return False


class RankGuard:
    """The rank's side: the watcher process and the pipe to it (timeouts in seconds; 0: none)."""

    def __init__(self, rank, launcher_pid, start_timeout, teardown=TEARDOWN_SECONDS, log_fd=2):
        self.teardown = teardown
        read, self._write = os.pipe()
        os.set_inheritable(self._write, False)
        command = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())]
        command += [str(launcher_pid), str(rank), str(start_timeout), str(teardown)]
        dups = [(os.POSIX_SPAWN_DUP2, fd, to) for fd, to in ((read, 0), (log_fd, 1), (log_fd, 2))]
        # setsid: outside the rank's process group, which it may have to end
        os.posix_spawn(sys.executable, command, os.environ, file_actions=dups, setsid=True)
        os.close(read)

    def _tell(self, message):
        with contextlib.suppress(OSError):  # the watcher is gone: it ended the rank, or was killed
            os.write(self._write, (message + "\n").encode())

    def phase(self, name):
        """The start is now in phase ``name`` (said in the line if the deadline passes)."""
        self._tell(f"phase {name}")

    def started(self):
        """The start is over (the ranks take their first step): no deadline any more."""
        self._tell("started")

    def finished(self):
        """The run has finished (its status is 0, every file it writes written): from now
        on this process ends with status 0 at the teardown's grace at the latest."""
        if not self.teardown:
            return
        sys.stdout.flush()  # ``_exit`` leaves Python's buffers unwritten
        sys.stderr.flush()
        deadline = time.monotonic() + self.teardown
        if exit_at(deadline):
            self._tell(f"finished {deadline!r}")

    def close(self):
        """The run is over: the watcher waits for this process to exit (past the grace, ends it)."""
        os.close(self._write)


def _parent_of(pid):
    """The parent process id of ``pid``, or None once it has ended (gone, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # the command name, in parentheses, may hold spaces
            state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError):
        return None
    return None if state in ("Z", "X") else int(parent)


def _end_group(rank_pid, leads_group):
    """SIGKILL the rank and, where it leads its process group (the launcher starts each
    rank in a session of its own), the processes it forked: gloo's rendezvous server and
    its manager on Paddle 2.6 outlived a killed rank 0."""
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if leads_group else os.kill)(rank_pid, signal.SIGKILL)


def watch(rank_pid, launcher_pid, rank, timeout, messages, teardown=TEARDOWN_SECONDS):
    """Until the rank and what it forked have ended: end them when the launcher is gone,
    when the start's deadline passes, or when the rank lives on ``teardown`` seconds after
    its run ended by an error or a stop. ``messages``: the pipe's read end."""
    try:
        leads_group = os.getpgid(rank_pid) == rank_pid
    except ProcessLookupError:
        return
    began = time.monotonic()
    phase, pending, ended_at, exits_at = "start-up", b"", None, None

    def end(line):
        os.write(2, f"error: rank {rank}: {line}\n".encode())
        _end_group(rank_pid, leads_group)

    while True:
        readable, _, _ = select.select([messages] if ended_at is None else [], [], [], POLL_SECONDS)
        if readable:
            chunk = os.read(messages, 4096)
            if not chunk:  # the rank closed its end: its run is over, it exits now
                ended_at = time.monotonic()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for message in lines:
                word, _, rest = message.decode().partition(" ")
                if word == "phase":
                    phase = rest
                elif word == "started":
                    phase = None
                elif word == "finished":
                    exits_at = float(rest)
        parent = _parent_of(rank_pid)
        now = time.monotonic()
        if parent is None:  # ended: what it forked ends with it
            if exits_at is not None and now >= exits_at:
                os.write(
                    2,
                    f"rank {rank}: its run had finished (status 0) and its teardown took "
                    f"{teardown:g} s: cut there, the rank ended with status 0 ({TEARDOWN_VARIABLE})"
                    "\n".encode(),
                )
            if leads_group:
                _end_group(rank_pid, leads_group)
            return
        if parent != launcher_pid:
            return end(
                f"its launcher (pid {launcher_pid}) is gone: this rank ends too, without "
                "saving; the checkpoints written are intact"
            )
        if exits_at is not None and now > exits_at + EXIT_MARGIN_SECONDS:
            return end(
                f"its run had finished (status 0), but it was still alive {teardown:g} s later, "
                f"past its own exit at the teardown's grace ({TEARDOWN_VARIABLE}): ended"
            )
        if exits_at is None and ended_at is not None and 0 < teardown < now - ended_at:
            return end(
                f"still alive {teardown:g} s after its run ended by an error or a stop (stuck "
                f"in Paddle's teardown; {TEARDOWN_VARIABLE}): ended"
            )
        if ended_at is None and phase is not None and 0 < timeout < now - began:
            return end(
                f"the start passed its deadline (--start-timeout {timeout:g} s) in phase "
                f"'{phase}': this rank ends (a peer that never came, or a stuck file system "
                "or device; a restart may succeed, and a start that is only slow needs a "
                "larger --start-timeout); the checkpoints written are intact"
            )


def main(argv):
    rank_pid, launcher_pid, rank, timeout, teardown = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rank decides what Ctrl-C means
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch(
        int(rank_pid), int(launcher_pid), rank, float(timeout), sys.stdin.fileno(), float(teardown)
    )


if __name__ == "__main__":
    main(sys.argv[1:])
