"""Run reports: DLLogger-style JSON lines on disk; on the console, a progress bar with
ETA and img/s when it is a terminal, plain DLLogger-style lines when it is not.

Each line of the report file is one JSON object:
    {"timestamp": ..., "elapsedtime": ..., "type": "LOG", "step": [epoch, step] | "PARAMETER"
     | "SUMMARY" | [epoch], "data": {...}}
as NVIDIA's DLLogger writes them, so its plotting and parsing tools apply.
"""

import json
import os
import socket
import sys
import time

from tqdm import tqdm

from paddle_resnet.core.errors import SIGNAL_BASE, UserError

# Narrower terminals (a 0-column pseudo-terminal, as some job schedulers give) get the
# lines: tqdm draws nothing at all there.
BAR_COLUMNS = 40


def _fits_a_bar(stream):
    try:
        return stream.isatty() and os.get_terminal_size(stream.fileno()).columns >= BAR_COLUMNS
    except (AttributeError, OSError, ValueError):  # not a file, or no size to ask for
        return False


def _outcome(exc_type, exc):
    """How a run ended, in MLflow's words: FINISHED, KILLED (a signal, Ctrl-C) or FAILED."""
    if exc_type is None:
        return "FINISHED"
    stopped = issubclass(exc_type, KeyboardInterrupt) or (
        getattr(exc, "exit_code", 0) >= SIGNAL_BASE  # training's Stopped
    )
    return "KILLED" if stopped else "FAILED"


class Report:
    """Appends to the JSON-lines file (a new run never erases an old one's lines), each
    run's lines beginning with a RUN record; only rank 0 writes and prints. ``trackers``
    (core/trackers/) get every record and the checkpoints saved."""

    def __init__(self, path, enabled=True, stream=sys.stdout, trackers=None):
        self.path = path
        self.enabled = enabled
        self.stream = stream
        # A person watching: progress bars instead of a line every few steps.
        self.interactive = enabled and _fits_a_bar(stream)
        self._trackers = trackers if enabled else None
        self.start = time.time()
        self._handle = None
        if enabled and path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._handle = open(path, "a")
        process = {"host": socket.gethostname(), "pid": os.getpid(), "argv": sys.argv}
        self.log("RUN", process, kind="RUN", console=False)

    def log(self, step, data, kind="LOG", console=True):
        record = {
            "timestamp": time.time(),
            "elapsedtime": round(time.time() - self.start, 3),
            "type": kind,
            "step": step,
            "data": data,
        }
        if self._handle:
            self._handle.write(json.dumps(record) + "\n")
            self._handle.flush()
        if self._trackers:
            self._trackers.record(kind, step, data)
            self._tracker_warnings()
        if console and self.enabled:
            self.print(self._console_line(step, data, kind))

    def saved(self, directory):
        """A checkpoint saved in ``directory``: said on the console, told to the trackers."""
        self.print(f"saved {directory}")
        if self._trackers:
            self._trackers.saved(directory)

    def _tracker_warnings(self):
        while not self._trackers.warnings.empty():
            self.print(self._trackers.warnings.get())

    def print(self, text):
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def progress(self, total, description):
        """A progress bar (ETA, rate) on a terminal; elsewhere a bar that draws nothing."""
        return tqdm(
            total=total,
            desc=description,
            file=self.stream,
            leave=True,
            disable=not self.interactive,
            dynamic_ncols=True,
            unit="batch",
        )

    def table(self, title, rows):
        width = max(len(name) for name, _ in rows)
        self.print("\n".join([title] + [f"  {name:<{width}}  {value}" for name, value in rows]))

    @staticmethod
    def _console_line(step, data, kind):
        if isinstance(step, (list, tuple)):
            where = " ".join(f"{name} {value}" for name, value in zip(("epoch", "step"), step))
        else:
            where = str(step)
        fields = "  ".join(
            f"{key} {value:.5g}" if isinstance(value, float) else f"{key} {value}"
            for key, value in data.items()
            if not isinstance(value, (dict, list))
        )
        return f"[{kind}] {where}: {fields}"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        self.close(_outcome(exc_type, exc))

    def close(self, outcome="FINISHED"):
        if self._handle:
            self._handle.close()
            self._handle = None
        if self._trackers:
            self._trackers.close(outcome)
            self._tracker_warnings()
            self._trackers = None


def read_report(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def validations(path):
    """(epoch, VAL data, CLASSES data) of each validation in the report at ``path``, in
    order; a run that resumed after a stop may repeat an epoch: the later one counts."""
    records = read_report(path)
    val = {tuple(r["step"]): r["data"] for r in records if r["type"] == "VAL"}
    per_class = {tuple(r["step"]): r["data"] for r in records if r["type"] == "CLASSES"}
    found = [(step[0], val[step], per_class[step]) for step in per_class if step in val]
    if not found:
        raise UserError(f"{path}: holds no validation with per-class results")
    return found
