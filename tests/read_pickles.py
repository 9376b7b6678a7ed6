"""Weights files read by ``checkpoint.read_pickle`` as a tool reads them, in a child
process of tests/test_pickles.py, so that a crash is an exit status, not a lost test.

    python tests/read_pickles.py crafted FILE...
        each file in a fork of its own, its end as ``errors.exit_status`` gives it; one
        JSON line per file: {"file", "status" (128 + N for signal N), "stderr" (its
        output, stdout too)}
    python tests/read_pickles.py mutated EXAMPLES SEED...
        EXAMPLES files made by Hypothesis from the real Paddle files SEED... (bytes
        flipped, inserted, cut; opcodes dropped, repeated, swapped, inserted), each read
        in this process: refused in one line (not for want of memory) or read as arrays,
        numbers and strings, else an AssertionError (status 1); the file being read is kept in
        ``<first seed>.current`` beforehand, so a crash leaves it to be named. One JSON
        line: how many were refused and how many were read.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import json
import os
import pickle
import pickletools
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_resnet.core import errors
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.training import checkpoint as ckpt


def crafted(paths):
    for path in paths:
        log = path + ".stderr"
        pid = os.fork()
        if pid == 0:
            output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(output, 1)  # Paddle's crash handler prints to stdout
            os.dup2(output, 2)
            status = errors.exit_status(lambda path=path: ckpt.read_pickle(path))
            sys.stderr.flush()
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        with open(log) as handle:
            stderr = handle.read()
        print(
            json.dumps(
                {"file": path, "status": code if code >= 0 else 128 - code, "stderr": stderr}
            )
        )


def _plain(value):
    """Whether ``value`` is what a parameter file may hold once read."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biufc"
    if isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return all(_plain(item) for _, item in items)
    return value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic))


# opcodes a mutation inserts: what a crafted file would add to an honest one
_INSERTS = [
    pickle.BUILD,
    pickle.REDUCE,
    pickle.MEMOIZE,
    pickle.BINGET + b"\x00",
    pickle.BINGET + b"\x05",
    pickle.TUPLE,
    pickle.MARK,
    pickle.POP,
    pickle.DUP,
    pickle.APPEND,
    pickle.SETITEM,
    pickle.STACK_GLOBAL,
    pickle.EMPTY_LIST,
    pickle.NEWOBJ,
    pickle.BINBYTES8 + (1 << 40).to_bytes(8, "little"),
    b"\x8c\x02O8",  # SHORT_BINUNICODE 'O8'
    b"\x8c\x02V8",
    b"\x8c\x05numpy\x8c\x05dtype\x93",
]


def mutated(examples, seeds):
    files = [open(path, "rb").read() for path in seeds]
    opcodes = [[file[pos:end] for (_, _, pos), end in _spans(file)] for file in files]
    current = seeds[0] + ".current"
    counts = {"refused": 0, "read": 0}
    edit = st.tuples(
        st.sampled_from(["flip", "insert", "cut", "drop", "repeat", "swap", "add"]),
        st.integers(0, 1 << 20),
        st.integers(0, 255),
    )

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.integers(0, len(files) - 1), st.lists(edit, min_size=1, max_size=6))
    def refused_or_arrays(which, edits):
        data = _mutate(files[which], opcodes[which], edits)
        with open(current, "wb") as handle:
            handle.write(data)
        try:
            state = ckpt.read_pickle(current)
        except CheckpointError as err:
            assert "\n" not in str(err), str(err)
            # a size beyond the file's end is refused before any allocation
            assert "MemoryError" not in str(err), str(err)
            counts["refused"] += 1
            return
        assert _plain(state), repr(state)[:300]
        counts["read"] += 1

    refused_or_arrays()
    os.remove(current)
    print(json.dumps(counts))


def _spans(file):
    ops = list(pickletools.genops(file))
    ends = [pos for _, _, pos in ops[1:]] + [len(file)]
    return zip(ops, ends)


def _mutate(file, opcodes, edits):
    data, ops = bytearray(file), list(opcodes)
    for kind, where, value in edits:
        if kind in ("flip", "insert", "cut"):
            at = where % (len(data) + 1)
            if kind == "flip" and at < len(data):
                data[at] ^= 1 << (value % 8)
            elif kind == "insert":
                data[at:at] = bytes([value])
            else:
                del data[at:]
        else:
            at = where % len(ops)
            if kind == "drop":
                del ops[at]
            elif kind == "repeat":
                ops.insert(at, ops[at])
            elif kind == "swap" and at + 1 < len(ops):
                ops[at], ops[at + 1] = ops[at + 1], ops[at]
            elif kind == "add":
                ops.insert(at, _INSERTS[value % len(_INSERTS)])
            data = bytearray(b"".join(ops))
    return bytes(data)


if __name__ == "__main__":
    if sys.argv[1] == "crafted":
        crafted(sys.argv[2:])
    else:
        mutated(int(sys.argv[2]), sys.argv[3:])
