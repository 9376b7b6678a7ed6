"""A watcher process beside each rank of ``paddle.distributed.launch``: it ends the rank
when its launcher is gone, or when the start (everything before the first training step)
passes its deadline, even while the rank's main thread is blocked in Paddle's C++ with
the GIL held, where no thread of the rank could run (seen: ``TCPStore.get``, gloo's and
NCCL's rendezvous).

The rank starts it (``RankGuard``) and tells it, through a pipe, which phase of the start
it is in (``phase``), when the start is over (``started``) and when its run is
(``close``); the watcher writes one line naming the rank, the phase and the cause into
the rank's log and ends the rank, and what it forked, with SIGKILL: a crash that a
restart may fix (the launcher reports 247, or the status of a rank before it in rank
order). It also ends a rank stuck in teardown after its run, and what a rank forked once
the rank has ended; then it ends itself.

Standard library only: the watcher runs this file with ``python -I -S``, without Paddle
or the package (``python -I -S rank_guard.py RANK_PID LAUNCHER_PID RANK TIMEOUT``).
"""

import os
import select
import signal
import sys
import time

POLL_SECONDS = 0.5
# A rank still alive this long after its run ended (its status said) is stuck in teardown.
TEARDOWN_SECONDS = 30


class RankGuard:
    """The rank's side: the watcher process and the pipe to it. ``start_timeout``: the
    seconds the start may take (0: no deadline; the launcher is watched all the same)."""

    def __init__(self, rank, launcher_pid, start_timeout, log_fd=2):
        read, self._write = os.pipe()
        os.set_inheritable(self._write, False)
        command = [sys.executable, "-I", "-S", os.path.abspath(__file__)]
        command += [str(os.getpid()), str(launcher_pid), str(rank), str(start_timeout)]
        os.posix_spawn(
            sys.executable,
            command,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,  # outside the rank's process group, which it may have to end
        )
        os.close(read)

    def _tell(self, message):
        try:
            os.write(self._write, (message + "\n").encode())
        except OSError:  # the watcher is gone (it ended the rank, or was killed)
            pass

    def phase(self, name):
        """The start is now in phase ``name`` (said in the line if the deadline passes)."""
        self._tell(f"phase {name}")

    def started(self):
        """The start is over (the ranks take their first step): no deadline any more."""
        self._tell("started")

    def close(self):
        """The run is over: the watcher waits for this process to exit (and ends it if it
        is still alive ``TEARDOWN_SECONDS`` later)."""
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
    try:
        if leads_group:
            os.killpg(rank_pid, signal.SIGKILL)
        else:
            os.kill(rank_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch(rank_pid, launcher_pid, rank, timeout, messages):
    """Until the rank and what it forked have ended: end them when the launcher is gone,
    when the start's deadline passes, or when the rank lives on ``TEARDOWN_SECONDS`` after
    its run ended (stuck in Paddle's teardown). ``messages``: the pipe's read end."""
    try:
        leads_group = os.getpgid(rank_pid) == rank_pid
    except ProcessLookupError:
        return
    began = time.monotonic()
    phase, pending, ended_at = "start-up", b"", None

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
        parent = _parent_of(rank_pid)
        now = time.monotonic()
        if parent is None:  # ended: what it forked ends with it
            if leads_group:
                _end_group(rank_pid, leads_group)
            return
        if parent != launcher_pid:
            return end(
                f"its launcher (pid {launcher_pid}) is gone: this rank ends too, without "
                "saving; the checkpoints written are intact"
            )
        if ended_at is not None and now - ended_at > TEARDOWN_SECONDS:
            return end(
                f"still alive {TEARDOWN_SECONDS:g} s after its run ended (stuck in Paddle's "
                "teardown): ended"
            )
        if ended_at is None and phase is not None and 0 < timeout < now - began:
            return end(
                f"the start passed its deadline (--start-timeout {timeout:g} s) in phase "
                f"'{phase}': this rank ends (a peer that never came, or a stuck file system "
                "or device; a restart may succeed, and a start that is only slow needs a "
                "larger --start-timeout); the checkpoints written are intact"
            )


def main(argv):
    rank_pid, launcher_pid, rank, timeout = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rank decides what Ctrl-C means
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch(int(rank_pid), int(launcher_pid), rank, float(timeout), sys.stdin.fileno())


if __name__ == "__main__":
    main(sys.argv[1:])
