"""oneDNN kernels for chosen ops of a static training program on the CPU.

Paddle's global ``FLAGS_use_mkldnn=1`` breaks static training (``reduce_mean_grad``
cannot reshape a oneDNN memory descriptor), but the op attribute ``use_mkldnn`` can be
set op by op. Measured on this project's 2-core CPU (ResNet-18, 32 px, batch 64,
Paddle 2.6.2, random data, one run each): plain kernels 121 img/s; oneDNN on conv2d
and its gradient 223; plus relu and its gradient 294; adding batch_norm, pool2d or
elementwise_add made it slower (139-265: layout conversions between oneDNN and plain
kernels). The demo's own benchmark (README) gives 126 -> 336 img/s.
"""
from paddle_resnet.distributed import gpu_available

# Forward and backward ops that run faster on oneDNN (see above); the rest stay plain.
TRAINING_OPS = ("conv2d", "conv2d_grad", "relu", "relu_grad")


def mark_for_onednn(program, op_types=TRAINING_OPS):
    """Set ``use_mkldnn`` on every op of ``program`` whose type is in ``op_types``;
    returns how many. Does nothing on GPU machines (cuDNN runs those ops there)."""
    if gpu_available():
        return 0
    marked = 0
    for block in program.blocks:
        for op in block.ops:
            if op.type in op_types and op.has_attr("use_mkldnn"):
                op._set_attr("use_mkldnn", True)
                marked += 1
    return marked
