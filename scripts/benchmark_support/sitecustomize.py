"""Counts the files under OPEN_COUNT_PREFIX that this process opens from Python (an audit
hook on "open"), written to OPEN_COUNT_DIR/<pid> every 10,000 opens and at exit: put on a
process's PYTHONPATH by scripts/benchmark_job_start.py, for every process of a job."""

import atexit
import os
import sys

_prefix = os.environ.get("OPEN_COUNT_PREFIX")
_folder = os.environ.get("OPEN_COUNT_DIR")
_count = [0]


def _write():
    with open(os.path.join(_folder, str(os.getpid())), "w") as handle:
        handle.write(str(_count[0]))


def _hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(_prefix):
        _count[0] += 1
        if _count[0] % 10_000 == 0:
            _write()


if _prefix and _folder:
    sys.addaudithook(_hook)
    atexit.register(_write)
    os.register_at_fork(after_in_child=lambda: _count.__setitem__(0, 0))  # its own count
