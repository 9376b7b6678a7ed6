"""One way to run a module or script of the toolkit in a child process: a measurement
that must not share this process's state (``training/cpu_kernels``), a conversion that
may crash the process (``deploy/pir_tensorrt``), a package living in another environment
(``deploy/nncf_int8``)."""

import subprocess
import sys

from paddle_resnet.core.errors import UserError

# ``python -m module args``, the child prepared first as a command prepares its process
PREPARED_MODULE = (
    "import runpy, sys; from paddle_resnet.core import bootstrap; bootstrap.prepare_process([]); "
    "del sys.argv[0]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def run(argv, failed, stdin=None, env=None):
    """``python argv`` (``["-m", module, ...]``, run in a prepared process, or a script and
    its arguments) with this interpreter; its standard output, or a UserError: ``failed``
    (e.g. "the TensorRT conversion failed") and the child's last line."""
    argv = ["-c", PREPARED_MODULE, *argv[1:]] if argv[0] == "-m" else argv
    done = subprocess.run(
        [sys.executable, *argv], input=stdin, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise UserError(f"{failed} ({lines[-1]})")
    return done.stdout
