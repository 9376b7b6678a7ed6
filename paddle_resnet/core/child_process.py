"""One way to run a module or script of the toolkit in a child process: a measurement
that must not share this process's state (``training/cpu_kernels``), a conversion that
may crash the process (``deploy/pir_tensorrt``), a package living in another environment
(``deploy/nncf_int8``)."""

import subprocess
import sys

from paddle_resnet.core.errors import UserError


def run(argv, failed, stdin=None, env=None):
    """``python argv`` (``["-m", module, ...]``, or a script and its arguments) with this
    interpreter; its standard output, or a UserError in one line: ``failed`` (what did not
    work, e.g. "the TensorRT conversion failed") and the child's last line."""
    done = subprocess.run(
        [sys.executable, *argv], input=stdin, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise UserError(f"{failed} ({lines[-1]})")
    return done.stdout
