"""train.py whose N-th training step fails as a GPU can, for the exit-status tests
(tests/test_exit_statuses.py; tests/test_slurm.py through the scripts' TRAIN_SCRIPT) on
machines where no device can fail:

    PADDLE_RESNET_FAULT=external-error@N python tests/ranks/device_fault.py <train.py flags>

The N-th training step of this process raises what Paddle's executor raises when a CUDA,
cuDNN or NCCL call fails: its ExternalError, which Paddle's exception mapping turns into
an ``OSError`` without errno (paddle/fluid/pybind/exception.cc). The hook is here, loaded
by the tests that use it: the toolkit has none, so no run of train.py can be made to
fail by a variable left in its environment. The run's first line says what is planted;
a missing or malformed variable is refused in one line, status 2.
"""

import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import os
import sys

from paddle_resnet.commands import train
from paddle_resnet.core.errors import USER_ERROR
from paddle_resnet.training import loop

VARIABLE = "PADDLE_RESNET_FAULT"
DRIVER = os.path.relpath(__file__, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def planned_step(spec):
    """The step ``spec`` (external-error@N) makes fail, or None when it is malformed."""
    kind, _, step = spec.partition("@")
    if kind != "external-error" or not step.isdigit() or int(step) < 1:
        return None
    return int(step)


def failing_at(step, train_step):
    """``train_step`` whose ``step``-th call raises Paddle's ExternalError instead."""
    calls = [0]

    def planted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == step:
            raise OSError(
                "(External) CUDA error(719), unspecified launch failure. [Hint: "
                "'cudaErrorLaunchFailure'. An exception occurred on the device while "
                f"executing a kernel.] (injected at step {step} by {VARIABLE}) "
                "(at /paddle/paddle/phi/backends/gpu/cuda/cuda_info.cc:258)"
            )
        return train_step(*args, **kwargs)

    return planted


if __name__ == "__main__":
    spec = os.environ.get(VARIABLE, "")
    step = planned_step(spec)
    if step is None:
        print(
            f"error: {DRIVER}: {VARIABLE}={spec!r}: expected external-error@N (N: a step, from 1)",
            file=sys.stderr,
        )
        sys.exit(USER_ERROR)
    print(
        f"fault injection ({DRIVER}, {VARIABLE}={spec}): training step {step} of this "
        "process raises Paddle's ExternalError",
        flush=True,
    )
    loop.train_step = failing_at(step, loop.train_step)
    sys.exit(train.main(sys.argv[1:]))
