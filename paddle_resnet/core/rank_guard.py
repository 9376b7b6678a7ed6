"""A watcher process beside each rank of ``paddle.distributed.launch``: it ends the rank
when its launcher is gone, or when the start (everything before the first training step)
passes its deadline, even while the rank's main thread is blocked in Paddle's C++ with
the GIL held, where no thread of the rank could run (seen: ``TCPStore.get``, gloo's and
NCCL's rendezvous).

The rank starts it (``RankGuard``) and tells it, through a pipe, which phase of the start
it is in (``phase``) and when the first step is done (``started``); the watcher writes
one line naming the rank, the phase and the cause into the rank's log and ends the rank
with SIGKILL: a crash that a restart may fix (the launcher reports 247, or the status of
a rank before it in rank order). The watcher ends by itself when the rank does.

Standard library only: the watcher runs this file with ``python -I -S``, without Paddle
or the package (``python -I -S rank_guard.py RANK_PID LAUNCHER_PID RANK TIMEOUT``).
"""

import os
import select
import signal
import subprocess
import sys
import time

POLL_SECONDS = 0.5


class RankGuard:
    """The rank's side: the watcher process and the pipe to it. ``start_timeout``: the
    seconds the start may take (0: no deadline, the launcher is still watched)."""

    def __init__(self, rank, launcher_pid, start_timeout, log_fd=2):
        read, self._write = os.pipe()
        os.set_inheritable(self._write, False)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                os.path.abspath(__file__),
                str(os.getpid()),
                str(launcher_pid),
                str(rank),
                str(start_timeout),
            ],
            stdin=read,
            stdout=log_fd,
            stderr=log_fd,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C to the job's process group is the rank's
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
        """The first step is done: the start's deadline no longer applies."""
        self._tell("started")

    def close(self):
        os.close(self._write)
        self.process.wait()


def _parent_of(pid):
    """The parent process id of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # the command name, in parentheses, may hold spaces
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _end(rank_pid, line):
    os.write(2, f"error: {line}\n".encode())
    try:
        os.kill(rank_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch(rank_pid, launcher_pid, rank, timeout, messages):
    """Until the rank ends: end it when its launcher is gone or the start's deadline
    passes. ``messages``: the pipe's read end."""
    began = time.monotonic()
    phase, pending = "start-up", b""
    while True:
        readable, _, _ = select.select([messages], [], [], POLL_SECONDS)
        if readable:
            chunk = os.read(messages, 4096)
            if not chunk:  # the rank closed its end: it is done, or gone
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for message in lines:
                word, _, rest = message.decode().partition(" ")
                if word == "phase":
                    phase = rest
                elif word == "started":
                    phase = None
        parent = _parent_of(rank_pid)
        if parent is None:
            return
        if parent != launcher_pid:
            _end(
                rank_pid,
                f"rank {rank}: its launcher (pid {launcher_pid}) is gone: this rank ends "
                "too, without saving; the checkpoints written are intact",
            )
            return
        elapsed = time.monotonic() - began
        if phase is not None and timeout > 0 and elapsed > timeout:
            _end(
                rank_pid,
                f"rank {rank}: the start passed its deadline (--start-timeout {timeout:g} s) "
                f"in phase '{phase}': this rank ends (a peer that never came, or a stuck "
                "file system or device; a restart may succeed, and a start that is only "
                "slow needs a larger --start-timeout); the checkpoints written are intact",
            )
            return


def main(argv):
    rank_pid, launcher_pid, rank, timeout = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rank decides what Ctrl-C means
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch(int(rank_pid), int(launcher_pid), rank, float(timeout), sys.stdin.fileno())


if __name__ == "__main__":
    main(sys.argv[1:])
