"""A device fault on demand, for the tests of the exit statuses (``errors.EXIT_STATUSES``)
with real processes where no GPU can fail: ``PADDLE_RESNET_FAULT=external-error@N`` makes
the N-th training step of this process raise what Paddle's executor raises when a CUDA,
cuDNN or NCCL call fails: its ExternalError, which Paddle's exception mapping turns into an
``OSError`` without errno (paddle/fluid/pybind/exception.cc). The variable is read here
only; unset, nothing happens."""

import os

from paddle_resnet.core.errors import UserError

VARIABLE = "PADDLE_RESNET_FAULT"
_steps = [0]


def _planned(environ):
    """The step that fails, or None."""
    spec = environ.get(VARIABLE)
    if not spec:
        return None
    kind, _, step = spec.partition("@")
    if kind != "external-error" or not step.isdigit() or int(step) < 1:
        raise UserError(f"{VARIABLE}={spec}: expected external-error@N (N: a step, from 1)")
    return int(step)


def before_step(environ=os.environ):
    """Count this process's training steps; raise the planned fault at its step."""
    _steps[0] += 1
    if _steps[0] == _planned(environ):
        raise OSError(
            "(External) CUDA error(719), unspecified launch failure. [Hint: "
            "'cudaErrorLaunchFailure'. An exception occurred on the device while executing "
            f"a kernel.] (injected at step {_steps[0]} by {VARIABLE}) "
            "(at /paddle/paddle/phi/backends/gpu/cuda/cuda_info.cc:258)"
        )
