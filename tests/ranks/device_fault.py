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

- ``non-finite-statistics@N``: after the N-th training step of this process, a batch
  norm's running mean holds nan (what a diverging rank's own statistics do: each rank
  keeps its own), the training loss unaffected.
- ``flipped-parameter@N``: after the N-th training step of this process, one element of
  a convolution's weights changes (what silent data corruption does: a bit flipped in a
  device's memory); the ranks' parameters then differ.

With ``PADDLE_RESNET_FAULT_RANK=R`` the fault is planted in rank R alone.

The hook is here, loaded by the tests that use it: the toolkit has none, so no run of
train.py can be made to fail by a variable left in its environment. The run's first
line says what is planted; a missing or malformed variable is refused in one line,
status 2.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import os
import sys

import numpy as np
import paddle

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


def _set_first(program, eligible, change):
    """``change`` applied in the scope to the first persistable of ``program`` that
    ``eligible`` accepts (by name); that name."""
    scope = paddle.static.global_scope()
    for var in sorted(program.list_vars(), key=lambda v: v.name):
        if var.persistable and eligible(var.name):
            tensor = scope.find_var(var.name).get_tensor()
            value = np.array(tensor)
            tensor.set(change(value), paddle.CPUPlace())
            return var.name
    raise AssertionError("nothing to plant the fault in")


def non_finite_statistics(programs):
    return _set_first(
        programs.train, lambda n: n.startswith("batch_norm") and n.endswith(".w_1"),
        lambda v: np.full_like(v, np.nan),
    )  # fmt: skip


def flipped_parameter(programs):
    def flip(value):
        value.reshape(-1)[0] += 1.0
        return value

    return _set_first(programs.train, lambda n: n.startswith("conv2d") and n.endswith(".w_0"), flip)


# kind: (what it plants, the object and attribute replaced, what the planted call does
# after the real one (the state a fault leaves), or None and the error it raises instead)
CHANGES = {
    "non-finite-statistics": ("training step", loop, "train_step", non_finite_statistics),
    "flipped-parameter": ("training step", loop, "train_step", flipped_parameter),
}
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


def changing_after(call, function, change):
    """``function`` whose ``call``-th call is followed by ``change(programs)`` (its
    second argument: ``loop.train_step``'s)."""
    calls = [0]

    def planted(*args, **kwargs):
        result = function(*args, **kwargs)
        calls[0] += 1
        if calls[0] == call:
            print(f"fault injection: {change(args[1])} changed", flush=True)
        return result

    return planted


if __name__ == "__main__":
    spec = os.environ.get(VARIABLE, "")
    kind, _, call = spec.partition("@")
    only_rank = os.environ.get("PADDLE_RESNET_FAULT_RANK")
    if kind not in {**KINDS, **CHANGES} or not call.isdigit() or int(call) < 1:
        print(
            f"error: {DRIVER}: {VARIABLE}={spec!r}: expected KIND@N, KIND one of "
            f"{', '.join([*KINDS, *CHANGES])}, N from 1",
            file=sys.stderr,
        )
        sys.exit(USER_ERROR)
    if only_rank is None or only_rank == os.environ.get("PADDLE_TRAINER_ID", "0"):
        if kind in CHANGES:
            what, owner, name, change = CHANGES[kind]
            planted = changing_after(int(call), getattr(owner, name), change)
            effect = f"is followed by a {kind.replace('-', ' ')}"
        else:
            what, owner, name, error = KINDS[kind]
            planted = failing_at(int(call), getattr(owner, name), error)
            effect = f"raises {type(error(call)).__name__}"
        print(
            f"fault injection ({DRIVER}, {VARIABLE}={spec}): {what} {call} of this process "
            f"{effect}",
            flush=True,
        )
        setattr(owner, name, planted)
    sys.exit(train.main(sys.argv[1:]))
