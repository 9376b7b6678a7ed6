"""The GPU settings of NVIDIA's Paddle ResNet-50 (``program.py`` ``create_strategy`` and
``dist_optimizer``, 2024), as data, and where they go.

- ``build_strategy_fields``: the BuildStrategy fusions under AMP (batch norm + ReLU,
  add + ReLU, batch norm + add + ReLU, in-place gradient accumulation) and, for the eval
  program, ``fix_op_run_order``.
- ``FLAGS``: cuDNN exhaustive search and a 4 GB workspace; ``FLAGS_apply_pass_to_program``
  around ``minimize``, without which Fleet does not apply the build strategy to a static
  program (NVIDIA sets it only in its README's docker line; tests/test_gpu_build.py).
- ``--fuse-resunit``: the cuDNN v8 ResUnit fusion pass, applied with Paddle's pass
  manager (Fleet's build-strategy copy drops the field); builds without the cuDNN
  frontend (every PyPI wheel) refuse it in one line.

On CPUs none of this applies: the fusions are CUDA kernels.
"""

import contextlib

import paddle
from paddle.distributed import passes

from paddle_resnet.core.errors import ConfigError
from paddle_resnet.models import model_entry

FLAGS = {"FLAGS_cudnn_exhaustive_search": True, "FLAGS_conv_workspace_size_limit": 4096}
APPLY_PASSES = "FLAGS_apply_pass_to_program"
RESUNIT_PASS = "fuse_resunit"


def build_strategy_fields(config, training):
    """{BuildStrategy field: value} for the train (``training``) or eval program."""
    fields = {}
    if not training:
        # NVIDIA's workaround for Paddle issue 39567 (per-rank metric all-reduces matched out
        # of order). Our eval program has no collective op: metrics are summed on the host
        # (distributed.all_reduce_sum), so this only keeps the op order fixed.
        fields["fix_op_run_order"] = True
    if config.amp.enabled:
        # QAT observes every batch norm's and addition's output, so Paddle's passes fuse
        # none of the forward ops but every backward one: a train program with
        # fused_batch_norm_act_grad and no fused_batch_norm_act (paddlepaddle-gpu 2.6.2,
        # seen as data; NVIDIA's reference builds it so). Without the forward fusion
        # there is nothing to gain: with QAT the passes stay off.
        fuse = not config.qat.enabled
        fields.update(
            fuse_bn_act_ops=fuse,
            fuse_elewise_add_act_ops=fuse,
            fuse_bn_add_act_ops=fuse,
            enable_addto=True,
        )
    return fields


def fleet_fields(config):
    """DistributedStrategy fields beyond AMP/ASP/QAT: batch norm's persistent cuDNN mode."""
    return {"cudnn_batchnorm_spatial_persistent": True} if config.amp.enabled else {}


def build_strategy(config, training):
    strategy = paddle.static.BuildStrategy()
    for name, value in build_strategy_fields(config, training).items():
        setattr(strategy, name, value)
    return strategy


def check_resunit(config, on_gpu):
    """ConfigError when --fuse-resunit cannot run here."""
    if not config.amp.fuse_resunit:
        return
    family = model_entry(config.model.arch).family
    if not family.residual_units:
        raise ConfigError(
            f"--fuse-resunit fuses residual units; {config.model.arch} ({family.name}) has none"
        )
    if not config.amp.enabled:
        raise ConfigError("--fuse-resunit fuses fp16 cuDNN kernels: it needs --amp")
    if not on_gpu:
        raise ConfigError("--fuse-resunit needs NVIDIA GPUs (cuDNN v8 fused ResUnit kernels)")
    if not _has_resunit_pass():
        raise ConfigError(
            f"--fuse-resunit: Paddle {paddle.__version__} is not built with the "
            "cuDNN frontend (fuse_resunit_pass); use NVIDIA's NGC PaddlePaddle "
            "container 23.12 or newer"
        )


def _has_resunit_pass():
    """Paddle 2.6 has no such field; 3.x builds without the cuDNN frontend refuse to set it."""
    try:
        setattr(paddle.static.BuildStrategy(), RESUNIT_PASS, True)
    except (AttributeError, RuntimeError):
        return False
    return True


def apply_cudnn_flags():
    """cuDNN's flags (GPU builds only: the CPU build has none)."""
    paddle.set_flags(FLAGS)


@contextlib.contextmanager
def passes_applied(on_gpu):
    """Around Fleet's ``minimize`` with ``on_gpu``: the build strategy's passes applied
    (put back after: later CPU programs build unfused)."""
    if not on_gpu:
        yield
        return
    previous = paddle.get_flags([APPLY_PASSES])[APPLY_PASSES]
    paddle.set_flags({APPLY_PASSES: True})
    try:
        yield
    finally:
        paddle.set_flags({APPLY_PASSES: previous})


def fuse_resunits(main, startup):
    """The cuDNN ResUnit fusion pass on the training program (checked by check_resunit)."""
    passes.PassManager([passes.new_pass(RESUNIT_PASS)]).apply([main], [startup])
