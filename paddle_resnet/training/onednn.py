"""oneDNN kernels for chosen ops of a static training program on the CPU.

Paddle's global ``FLAGS_use_mkldnn=1`` breaks static training (``reduce_mean_grad``
cannot reshape a oneDNN memory descriptor; on PIR the max-pool gradient fails), but ops
can be chosen one by one: the attribute ``use_mkldnn`` on the legacy IR, a rewrite into
PIR's oneDNN dialect (``paddle_internals.onednn_ops_on_pir``). Measured (ResNet-18, 32 px,
2 cores): conv2d, relu and their gradients each added speed; batch_norm, pool2d,
elementwise_add and sum as well lost most of it (oneDNN's batch_norm took 5x the plain
kernels' time). Today's figures: docs/measurements.md, CPU training.

NCHW only: with NHWC tensors Paddle's oneDNN ``conv2d_grad`` computes wrong filter
gradients (2.6.2 and 3.3.1: one SGD step's weight updates differ from the plain
kernels' by more than their own size, where NCHW agrees to 2e-4); it looked 28 %
faster, and the demo trained with it reached 85.2 % instead of 89 %.

bf16 AMP on PIR trains its convolutions here too, in bf16 on AMX: Paddle has no plain
bf16 convolution, and its own fallback to oneDNN's ran an fp32 primitive behind reorders,
as the kernel takes its data type from an attribute, which the rewrite sets. Batch norms
stay fp32 (their CPU kernels take no bf16), and so do the weights and their updates; the
casts stay on Paddle's kernel (on oneDNN's the ResNet-50 step ran at 0.65x). The legacy
IR's bf16 rewrite cannot train through these kernels (``decorate_bf16`` casts the
filters, which the convolution refuses), so bf16 AMP is PIR's only.
"""

from paddle_resnet.core import devices, paddle_internals
from paddle_resnet.core.devices import gpu_available
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.training import ir
from paddle_resnet.training.distributed import uses_gloo


def onednn_wanted(config):
    """``--cpu-onednn`` as given; with bf16 AMP always; unset, None: measured
    (``cpu_kernels.py``). Never for NHWC. Unset, not for gloo ranks on Paddle 3.x: a
    resumed 2-rank run departed from the uninterrupted one (BN biases 0.009 apart after
    an epoch; 2.6.2 resumes exactly). Call after ``distributed.init_fleet``."""
    nchw = config.model.data_layout == "NCHW"
    if ir.bf16_amp(config) and not gpu_available():
        if not nchw or config.run.cpu_onednn is False:
            raise ConfigError(
                "--amp-dtype bfloat16 trains its convolutions on oneDNN (Paddle has no other "
                "bf16 convolution on the CPU): drop --no-cpu-onednn and keep --data-layout NCHW"
            )
        return True
    if config.run.cpu_onednn and not nchw:
        raise ConfigError(
            "--cpu-onednn needs --data-layout NCHW: Paddle's oneDNN convolution "
            "gradients are wrong for NHWC tensors"
        )
    if config.run.cpu_onednn is not None:
        return config.run.cpu_onednn
    if not nchw or gpu_available() or (paddle_internals.PADDLE3 and uses_gloo()):
        return False
    return None


def bf16_note(config, flags=None):
    """A warning line where bf16 AMP is asked for on a CPU without AMX, else None."""
    if not ir.bf16_amp(config) or gpu_available():
        return None
    flags = devices.cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return None
    return (
        "warning: --amp-dtype bfloat16 on a CPU without AMX: bf16 trains no faster here "
        "(ResNet-50 at 224 px: 0.67x fp32 on an AVX-512 Xeon without AMX); fp32 is the "
        "faster choice on this CPU"
    )


def mark_for_onednn(program, op_types):
    """Put every op of ``program`` whose type is in ``op_types`` (the family's
    ``onednn_training_ops``) on oneDNN kernels; how many (none on GPU machines)."""
    if gpu_available():
        return 0
    if paddle_internals.is_pir_program(program):
        return paddle_internals.onednn_ops_on_pir(program, op_types)
    marked = 0
    for block in program.blocks:
        for op in block.ops:
            if op.type in op_types and op.has_attr("use_mkldnn"):
                paddle_internals.set_op_attr(op, "use_mkldnn", True)
                marked += 1
    return marked
