"""What a model family declares once, beside its network module: how the toolkit builds
one kind of network and everything the rest of the code must know of it and would
otherwise guess. What int8 quantizes is not declared: it is read from the built program
(``training/qat.int8_ops``).
"""

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class WeightNaming:
    """How one source of pretrained weights (another framework's files) names the
    family's tensors; ours are ``model.state_dict()``'s structured names."""

    name: str
    rename: Callable[[str, Any], str]  # (our structured name, the member's spec) -> the file's
    transposed: Tuple[str, ...] = ()  # our names whose matrices the file stores [out, in]
    ignored: Tuple[str, ...] = ()  # suffixes of file tensors with no counterpart
    # What the source's models expect: RGB in [0, 1], then (x - mean) / std.
    mean: Tuple[float, float, float] = IMAGENET_MEAN
    std: Tuple[float, float, float] = IMAGENET_STD
    variant: Optional[str] = None  # which of the family's variants the source's models are


@dataclass(frozen=True)
class ModelFamily:
    name: str  # as messages name it: "ResNet"
    # (spec, the model config section) -> a paddle.nn.Layer; with ``fused_cpu_training``,
    # (spec, the model config section, the fused CPU kernels or None)
    build: Callable[..., Any]
    classifier: str = "fc"  # the layer path of the classifier
    dense_under_sparsity: Tuple[str, ...] = ("fc",)  # layer paths 2:4 pruning leaves dense
    layouts: Tuple[str, ...] = ("NCHW", "NHWC")  # input layouts the network takes
    weight_namings: Tuple[WeightNaming, ...] = ()  # the sources its weights import from
    # Made of residual units whose last batch norm --zero-init-residual zeroes and which
    # --fuse-resunit fuses (cuDNN's ResUnit pattern).
    residual_units: bool = False
    # Members with the same shapes that compute differently (ResNet v1 and v1.5): the
    # variant of a spec, or None; a weight file of another variant is refused, saying
    # what tells them apart (``variant_difference``).
    variant: Callable[[Any], Optional[str]] = lambda spec: None
    variant_difference: str = ""
    # The layer paths of each stage, the stem first, in the order the input meets them:
    # --frozen-stages freezes a prefix of them, --lr-mult-list scales each one's rate.
    stages: Tuple[Tuple[str, ...], ...] = ()
    # The train program's op types measured faster on oneDNN kernels than on Paddle's
    # plain CPU kernels for this family (``training/onednn.py``; each needs its PIR
    # rewrite pattern in ``core/paddle_internals``); none: plain kernels throughout.
    onednn_training_ops: Tuple[str, ...] = ()
    # Its batch norms, with the addition and ReLU after them, can train through the
    # toolkit's fused CPU kernels (``training/cpu_ops``, --cpu-fused-bn): ``build`` takes
    # them as a third argument.
    fused_cpu_training: bool = False

    def classifier_parameters(self, model):
        """The classifier's parameter names in a built ``model``'s programs."""
        return tuple(p.name for p in getattr(model, self.classifier).parameters())

    def classifier_keys(self):
        """The classifier's structured names (``model.state_dict()``): weight and bias."""
        return (f"{self.classifier}.weight", f"{self.classifier}.bias")
