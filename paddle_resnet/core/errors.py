"""Errors that reach the user as one line, and the exit statuses a scheduler acts on.

Every tool and script ends through ``exit_status``, which prints an error without a
traceback and returns its status from ``EXIT_STATUSES``, the one table of what each
status means (docs/guide.md prints it), which the Slurm scripts and the Kubernetes
manifests (scripts/cluster/) act on."""

import dataclasses
import errno
import os
import signal
import sys

from paddle_resnet.core.bootstrap import launched

FINISHED = 0
UNEXPECTED = 1  # Python's own status for an uncaught exception (a traceback: a bug)
USER_ERROR = 2  # argparse's too
# sysexits.h's EX_TEMPFAIL, "a temporary failure: the request should be reattempted
# later": below 128, so that nothing takes it for a death by signal.
RESTARTABLE = 75
SIGNAL_BASE = 128  # 128 + N: stopped by signal N, as shells, Slurm and Kubernetes read it
# paddle.distributed.launch after a SIGTERM to it: Paddle's sys.exit of the signal's number
LAUNCHER_STOPPED = int(signal.SIGTERM)


def stopped_status(signal_number):
    """The status of a process stopped by ``signal_number``: 130 for SIGINT, 143 for SIGTERM."""
    return SIGNAL_BASE + int(signal_number)


@dataclasses.dataclass(frozen=True)
class ExitStatus:
    """One row of the contract: the status, what it means, examples, what schedulers do."""

    status: str
    meaning: str
    examples: str
    scheduler: str


EXIT_STATUSES = (
    ExitStatus(
        str(FINISHED),
        "finished",
        "the run is done (a finished run started again exits 0 at once)",
        "Slurm: COMPLETED; Indexed Job: the pod succeeds",
    ),
    ExitStatus(
        str(USER_ERROR),
        "input that no restart can fix (one line names it)",
        "bad flags or configuration, data that cannot be read as asked, a checkpoint that does not "
        "fit or belongs to another run, every checkpoint damaged; a run that diverged (a loss or "
        "weights not finite: the line names the step, the loss, the learning rate, the last finite "
        "checkpoint and what to change; nothing non-finite is saved, so a restart would diverge "
        "again); a full disk or quota, no permission, a read-only or lock-less file system: a "
        "person must act first (free space, change the mount), and a restart would fail the same "
        "way, a full disk only after repeating the epoch it could not save",
        "Slurm: FAILED, not requeued; Indexed Job: fails at once (FailJob); TrainJob "
        "(Trainer v2): the JobSet fails at once (FailJobSet); PaddleJob: retried until "
        "its backoffLimit (OnFailure cannot tell statuses apart)",
    ),
    ExitStatus(
        str(RESTARTABLE),
        "a crash that a restart may fix (one line names it; the checkpoints are intact)",
        "Paddle's external errors (a CUDA, cuDNN or NCCL call failed: Paddle raises them as "
        "OSError without errno), out of memory, a lost or stuck peer (a rank that died, "
        "the --collective-timeout watchdog, a rank ended by its launcher because another "
        "ended first), an I/O error of the file system (EIO, ESTALE, ETIMEDOUT: a shared "
        "volume), a rank whose launcher died",
        "Slurm: requeued, FAILED once 3 starts in a row crashed without writing a "
        "checkpoint (MAX_CRASHES_WITHOUT_PROGRESS); Indexed Job and PaddleJob: the pod "
        "restarts, counted against backoffLimit; TrainJob: the JobSet restarts, FAILED "
        "once 3 starts in a row made no new verified checkpoint (start_node.py)",
    ),
    ExitStatus(
        f"{UNEXPECTED}, others",
        "a crash of unknown cause",
        "1: an unexpected error with a Python traceback (a bug); 137: SIGKILL (the OOM "
        "killer); 241 / 247: paddle.distributed.launch after it had to stop or kill a rank",
        f"as {RESTARTABLE}",
    ),
    ExitStatus(
        f"{stopped_status(signal.SIGTERM)}, {stopped_status(signal.SIGINT)}",
        "stopped by SIGTERM / SIGINT (128 + the signal): resumable",
        "in the training steps: saved at the step in flight, one line names the checkpoint "
        "and the command that continues; before or after them: nothing new to save",
        "Slurm: requeued by Slurm (preemption, scontrol requeue) or, after the time "
        "limit's warning, by the script; Indexed Job: not counted (Ignore); TrainJob: the "
        "JobSet restarts, not counted",
    ),
    ExitStatus(
        str(LAUNCHER_STOPPED),
        "paddle.distributed.launch after a SIGTERM to it (its ranks stopped as above)",
        "Paddle's launcher exits with the signal's number: 15, or 2 after a SIGINT, which "
        "schedulers do not send (Ctrl-C on a terminal)",
        f"as {stopped_status(signal.SIGTERM)}",
    ),
)


def exit_status_table():
    """``EXIT_STATUSES`` as the Markdown table docs/guide.md prints."""
    lines = ["| status | means | for example | what the schedulers do |", "|---|---|---|---|"]
    lines += [f"| {r.status} | {r.meaning} | {r.examples} | {r.scheduler} |" for r in EXIT_STATUSES]
    return "\n".join(lines) + "\n"


class UserError(Exception):
    """Bad input from the user: a path, a value, a file. The message names it."""


class ConfigError(UserError):
    """A configuration key or value that cannot be used."""


class DataError(UserError):
    """An image tree, record file or image that cannot be read as asked."""


class CheckpointError(UserError):
    """A checkpoint or parameter file that is missing, truncated or does not fit."""


class Diverged(UserError):
    """Training made non-finite by its settings: a restart from its last checkpoint diverges too."""


class RestartableError(Exception):
    """A fault a restart may fix: a lost or stuck peer, an I/O error of the file system."""


# OSError numbers that are the user's input: a path that is not there or not of its kind.
_PATH_ERRORS = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
    errno.ENOTEMPTY,
    errno.ENAMETOOLONG,
    errno.ELOOP,
    errno.EXDEV,
}
# A person must act before a restart can succeed: free space, grant access, remount.
_SPACE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_ACCESS_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS}
LOCK_ERRORS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


def paddle_external_error(err):
    """Whether ``err`` is Paddle's ExternalError (a CUDA, cuDNN, NCCL ... call failed),
    which Paddle's exception mapping raises as an OSError without errno
    (paddle/fluid/pybind/exception.cc), unlike a file the user named."""
    text = str(err)
    return (
        isinstance(err, OSError)
        and err.errno is None
        and ("(External)" in text or "ExternalError" in text)
    )


def os_error_is_users(err):
    """Whether an OSError needs the user to act (a path, space, access, locks: a restart fails
    the same way), not a fault of the system that a restart may fix."""
    return err.errno in _PATH_ERRORS | _SPACE_ERRORS | _ACCESS_ERRORS | LOCK_ERRORS


def os_error_reason(err):
    """An OSError's reason, with what to do about one the user must act on."""
    reason = err.strerror or str(err)
    if err.errno in _SPACE_ERRORS:
        return f"{reason}: free space or raise the quota (--keep-checkpoints N keeps fewer)"
    if err.errno == errno.EROFS:
        return f"{reason}: the file system is mounted read-only"
    return reason


def first_line(err):
    text = str(err).strip()
    return text.splitlines()[0] if text else repr(err)


def _summary(err):
    """The line of a Paddle error that says what failed, without its C++ location."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "External" in line] or lines or [type(err).__name__]
    return named[0].split(" (at /")[0].replace("ExternalError: ", "").replace("(External) ", "")


def describe(err):
    """(exit status, the one line) of an exception ``exit_status`` ends a tool with."""
    if isinstance(err, UserError):
        return USER_ERROR, f"error: {err}"
    if isinstance(err, RestartableError):
        return RESTARTABLE, f"error: {err}"
    if isinstance(err, MemoryError):
        what = _summary(err) if str(err) else "out of memory"
        return RESTARTABLE, f"error: out of memory ({what}): a restart may succeed"
    if paddle_external_error(err):
        return RESTARTABLE, (
            f"error: a CUDA, cuDNN or NCCL call failed (Paddle's ExternalError: "
            f"{_summary(err)}): a restart may succeed; the checkpoints written are intact"
        )
    line = f"error: {err.filename + ': ' if err.filename else ''}{os_error_reason(err)}"
    if os_error_is_users(err):
        return USER_ERROR, line
    return RESTARTABLE, f"{line} (an I/O error of the file system: a restart may succeed)"


def exit_status(action):
    """``action()``'s exit status: the int it returns, else 0 (``sys.exit`` of a returned
    folder would print it and exit 1). Bad input and faults print one ``error: ...`` line
    and return their status (``describe``; a rank of ``paddle.distributed.launch`` ends with
    it at once); any other exception is a bug and keeps Python's traceback and status 1."""
    try:
        status = action()
        return status if isinstance(status, int) else FINISHED
    except (UserError, RestartableError, MemoryError, OSError) as err:
        status, line = describe(err)
        print(line, file=sys.stderr)
        if launched():
            # A rank ends at once with its status: its launcher kills the ranks it stops
            # 3 s after its SIGTERM, and Paddle's and DALI's teardown took 2 s and more.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status
