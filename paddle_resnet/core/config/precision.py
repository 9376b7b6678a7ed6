"""The sections of what training changes in the numbers: mixed precision, quantization-aware training, 2:4 sparsity."""

from dataclasses import dataclass
from typing import Tuple

from paddle_resnet.core.config.keys import AMP_DTYPES, MASK_ALGOS, TRAIN_EXPORT, key, positive


@dataclass(frozen=True)
class AmpConfig:
    enabled: bool = key(
        False,
        "--amp",
        "automatic mixed precision (legacy IR: Fleet strategy.amp; PIR: paddle.amp)",
        tools=TRAIN_EXPORT,
    )
    dtype: str = key(
        "float16",
        "--amp-dtype",
        "the low precision of --amp: float16 (GPUs; loss scaling) or bfloat16 (PIR only; "
        "CPUs with AVX512-BF16 or AMX, Ampere and newer GPUs; no loss scaling)",
        choices=AMP_DTYPES,
        tools=TRAIN_EXPORT,
    )
    scale_loss: float = key(1.0, "--scale-loss", "initial loss scaling", positive)
    use_dynamic_loss_scaling: bool = key(
        False, "--use-dynamic-loss-scaling", "dynamic loss scaling"
    )
    use_pure_fp16: bool = key(
        False, "--use-pure-fp16", "pure fp16 (O2) instead of mixed (O1)", tools=TRAIN_EXPORT
    )
    fuse_resunit: bool = key(
        False,
        "--fuse-resunit",
        "cuDNN v8 ResUnit fusion of the training program (with --amp; needs a Paddle built with "
        "the cuDNN frontend, e.g. NGC 23.12+)",
    )


@dataclass(frozen=True)
class QatConfig:
    enabled: bool = key(
        False,
        "--qat",
        "quantization-aware training, NVIDIA's settings (legacy IR: Fleet strategy.qat; "
        "PIR: paddle.quantization's QAT); give it to export_model.py too, for an INT8 "
        "model with the trained scales (from PIR: an int8 model.onnx with --onnx)",
        tools=TRAIN_EXPORT,
    )


@dataclass(frozen=True)
class AspConfig:
    enabled: bool = key(
        False,
        "--asp",
        "2:4 sparsity: masks keep the pruned weights at zero through training (Fleet's "
        "strategy.asp on the legacy IR; the toolkit's own masks on PIR and with --qat)",
    )
    prune_model: bool = key(
        False,
        "--prune-model",
        "prune the weights to 2:4 before training (needs --asp; a resumed "
        "run keeps its checkpoint's masks)",
        resume_may_change=True,
    )
    mask_algo: str = key("mask_1d", "--mask-algo", "mask algorithm", choices=MASK_ALGOS)
    exclude: Tuple[str, ...] = key(
        (),
        "--asp-exclude",
        "layers kept dense besides those the model's registry entry keeps (a ResNet's "
        "classifier, fc): comma-separated model paths (e.g. layer4.2.conv3) or parameter names",
    )
