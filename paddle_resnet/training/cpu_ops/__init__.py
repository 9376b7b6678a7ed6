"""The toolkit's own CPU training kernels, Paddle custom operators (``bn_act.cc``): batch
norm on the batch's statistics fused with the residual addition and the ReLU after it,
forward and backward, on fp32 activations (the kernels also take bf16, which no program
hands them yet: bf16 AMP's convolutions are oneDNN's, see ``resolved``). Built on first
use by Paddle's ``cpp_extension`` (g++, ``-march=native``) into a cache keyed by the
source, Paddle's version and the CPU's instruction sets; a machine where they cannot be
built trains on Paddle's kernels and says so in one line (``loaded``).
"""

import dataclasses
import fcntl
import functools
import hashlib
import os
import shutil

import paddle
from paddle.utils import cpp_extension

from paddle_resnet.core import bootstrap, devices, paddle_internals
from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.models import model_entry
from paddle_resnet.training import ir

SOURCE = os.path.join(os.path.dirname(__file__), "bn_act.cc")
FLAGS = ["-O3", "-march=native", "-fopenmp"]
# The CPU's flags that decide what -march=native compiles for.
ISA_PREFIXES = ("avx", "amx", "fma", "f16c", "bmi", "sse", "vnni")


def cache_folder():
    """Where this source, Paddle and CPU's build lives."""
    flags = sorted(f for f in devices.cpu_flags() if f.startswith(ISA_PREFIXES))
    with open(SOURCE, "rb") as handle:
        digest = hashlib.sha256(handle.read())
    digest.update(" ".join([paddle.__version__, paddle.__file__, *FLAGS, *flags]).encode())
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "paddle-resnet", "cpu_ops", digest.hexdigest()[:16])


@functools.lru_cache(maxsize=1)
def loaded():
    """(the ops, None) or (None, why they cannot be used here), built once per process;
    ranks of one machine build in turn (a lock beside the build)."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        return None, "no C++ compiler (g++; scripts/setup.sh installs it)"
    folder, verbose = cache_folder(), bootstrap.verbose()
    try:
        os.makedirs(folder, exist_ok=True)
        with open(folder + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with bootstrap.paddle_chatter(verbose), bootstrap.native_chatter(verbose):
                module = cpp_extension.load(
                    name="prn_cpu_ops",
                    sources=[SOURCE],
                    extra_cxx_cflags=FLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=folder,
                    verbose=verbose,
                )
    except (OSError, RuntimeError, ImportError, SystemExit) as err:
        # cpp_extension reports a failed compile as RuntimeError (2.6) or by exiting setup
        return None, f"they did not build in {folder} ({type(err).__name__}: {err})"
    return Ops(module), None


class Ops:
    """The loaded operators, called as the model's layers call them."""

    def __init__(self, module):
        self._module = module

    def bn_act(self, bn, x, residual=None, relu=True):
        """``bn`` (a training ``nn.BatchNorm2D``) on ``x``, then ``+ residual``, then ReLU;
        in ``x``'s dtype, the running statistics updated in place."""
        (epsilon, momentum), params = paddle_internals.batch_norm_state(bn)
        attrs = (epsilon, momentum, bool(relu))
        if residual is None:
            return self._module.prn_bn_act(x, *params, *attrs)[0]
        return self._module.prn_bn_add_act(x, residual, *params, *attrs)[0]


def resolved(config, world_size):
    """(``config`` with ``run.cpu_fused_bn`` decided, the line saying so or None): where
    asked for and buildable here; on GPUs never. On PIR its convolutions are Paddle's plain
    ones (PIR hands a oneDNN op's output to a custom operator in oneDNN's blocked layout,
    unconverted, which the kernels refuse). A job of several processes stops where they do
    not build (its ranks' programs must be the same)."""
    pir = ir.is_pir(config)
    use = config.run.cpu_fused_bn and _applicable(config, pir)
    line = None
    if use:
        ops, why = loaded()
        if ops is None and world_size > 1:
            raise UserError(f"--cpu-fused-bn: the toolkit's CPU kernels are unavailable, {why}")
        use = ops is not None
        line = (
            "CPU fused kernels: batch norm, addition and ReLU in one"
            + (" (PIR: on Paddle's plain convolutions)" if pir else "")
            if use
            else f"CPU fused kernels: unavailable, {why}: Paddle's kernels"
        )
    run = dataclasses.replace(config.run, cpu_fused_bn=bool(use))
    if use and pir:
        run = dataclasses.replace(run, cpu_onednn=False)
    return dataclasses.replace(config, run=run), line


def _applicable(config, pir):
    """Whether the fused kernels can train ``config``'s model (asked for); ConfigError
    where they cannot."""
    if devices.gpu_available():
        return False
    why = None
    if not model_entry(config.model.arch).family.fused_cpu_training:
        why = f"a model family that trains through them (not {config.model.arch})"
    elif config.model.data_layout != "NCHW":
        why = "NCHW activations (--data-layout NCHW)"
    elif config.run.sync_bn:
        why = "the batch statistics of one process (not --sync-bn)"
    elif config.amp.enabled:
        # bf16 AMP is PIR's and trains its convolutions on oneDNN (Paddle has no other
        # bf16 convolution on the CPU), whose outputs PIR hands over in oneDNN's layout
        why = "fp32 activations (not --amp: bf16 AMP's oneDNN convolutions on PIR)"
    elif config.run.cpu_onednn and pir:
        why = "Paddle's plain convolutions on PIR (--no-cpu-onednn; or --ir legacy)"
    if why:
        raise ConfigError(f"--cpu-fused-bn takes {why}")
    return True


def for_program(config, training):
    """The ops a program of ``config`` trains through (after ``resolved``), or None."""
    return loaded()[0] if training and config.run.cpu_fused_bn else None
