"""train.py with a device fault planted, for the exit-status tests (tests/test_exit_statuses.py,
tests/test_fault_statuses.py; tests/test_slurm.py through the scripts' TRAIN_SCRIPT) on
machines where no device can fail:

    PADDLE_RESNET_FAULT=KIND@N python tests/ranks/device_fault.py <train.py flags>

- ``external-error@N``: the N-th training step of this process raises what Paddle's
  executor raises when a CUDA, cuDNN or NCCL call fails: its ExternalError, which Paddle's
  exception mapping turns into an ``OSError`` without errno
  (paddle/fluid/pybind/exception.cc).
- ``out-of-memory@N``: the N-th validation batch of this process (a run of the evaluation
  predictor) raises what Paddle raises when the device's memory is exhausted: its
  ResourceExhaustedError, mapped to ``MemoryError``.

The hook is here, loaded by the tests that use it: the toolkit has none, so no run of
train.py can be made to fail by a variable left in its environment. The run's first
line says what is planted; a missing or malformed variable is refused in one line,
status 2.
"""

import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import os
import sys

from paddle_resnet.commands import train
from paddle_resnet.core.errors import USER_ERROR
from paddle_resnet.training import eval_predictor, loop

VARIABLE = "PADDLE_RESNET_FAULT"
DRIVER = os.path.relpath(__file__, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def external_error(call):
    return OSError(
        "(External) CUDA error(719), unspecified launch failure. [Hint: "
        "'cudaErrorLaunchFailure'. An exception occurred on the device while executing a "
        f"kernel.] (injected at step {call} by {VARIABLE}) "
        "(at /paddle/paddle/phi/backends/gpu/cuda/cuda_info.cc:258)"
    )


def out_of_memory(call):
    return MemoryError(
        "ResourceExhaustedError: \n\nOut of memory error on GPU 0. Cannot allocate 1.50GB "
        f"memory on GPU 0, 39.2GB memory has been allocated (injected at run {call} by "
        f"{VARIABLE}).\n (at /paddle/paddle/fluid/memory/allocation/"
        "cuda_allocator.cc:86)"
    )


# kind: (what it plants, the object and attribute replaced, the error)
KINDS = {
    "external-error": ("training step", loop, "train_step", external_error),
    "out-of-memory": (
        "validation batch",
        eval_predictor.EvalPredictor,
        "__call__",
        out_of_memory,
    ),
}


def failing_at(call, function, error):
    """``function`` whose ``call``-th call raises ``error(call)`` instead."""
    calls = [0]

    def planted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise error(call)
        return function(*args, **kwargs)

    return planted


if __name__ == "__main__":
    spec = os.environ.get(VARIABLE, "")
    kind, _, call = spec.partition("@")
    if kind not in KINDS or not call.isdigit() or int(call) < 1:
        print(
            f"error: {DRIVER}: {VARIABLE}={spec!r}: expected KIND@N, KIND one of "
            f"{', '.join(KINDS)}, N from 1",
            file=sys.stderr,
        )
        sys.exit(USER_ERROR)
    what, owner, name, error = KINDS[kind]
    print(
        f"fault injection ({DRIVER}, {VARIABLE}={spec}): {what} {call} of this process "
        f"raises {type(error(call)).__name__}",
        flush=True,
    )
    setattr(owner, name, failing_at(int(call), getattr(owner, name), error))
    sys.exit(train.main(sys.argv[1:]))
