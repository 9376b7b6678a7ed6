"""The learning sections: the LR schedule, the optimizer, the loss, fine-tuning."""

from dataclasses import dataclass
from typing import Optional, Tuple

from paddle_resnet.core.config.keys import LR_SCHEDULES, at_least, each, in_range, key, positive


@dataclass(frozen=True)
class LRConfig:
    base: float = key(
        0.256,
        "--lr",
        "learning rate for --lr-reference-batch images; scaled to the global batch",
        positive,
    )
    reference_batch: int = key(
        256, "--lr-reference-batch", "global batch that --lr refers to", at_least(1)
    )
    schedule: str = key("cosine", "--lr-scheduler", "after warm-up", choices=LR_SCHEDULES)
    warmup_epochs: float = key(5.0, "--warmup-epochs", "linear warm-up epochs", at_least(0))
    warmup_start_lr: float = key(0.0, "--warmup-start-lr", "learning rate at step 0", at_least(0))
    milestones: Tuple[int, ...] = key(
        (30, 60, 80),
        "--lr-milestones",
        "step schedule: epochs where the LR drops, e.g. 30,60,80",
        lambda v: (
            None
            if list(v) == sorted(set(v)) and all(e > 0 for e in v)
            else f"must be increasing positive epochs, got {v}"
        ),
    )
    decay_factor: float = key(
        0.1,
        "--lr-decay-factor",
        "step schedule: factor at each milestone",
        lambda v: None if 0 < v <= 1 else f"must be in (0, 1], got {v}",
    )


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = key(
        "Momentum",
        "--optimizer",
        "optimizer (SGD with momentum, as NVIDIA's)",
        choices=("Momentum",),
    )
    momentum: float = key(0.875, "--momentum", "SGD momentum", in_range(0, 1, "[0, 1)"))
    nesterov: bool = key(False, "--nesterov", "Nesterov momentum")
    weight_decay: float = key(
        3.0517578125e-05, "--weight-decay", "L2 weight decay of conv and FC weights", at_least(0)
    )
    bn_weight_decay: bool = key(False, "--bn-weight-decay", "also decay BN scale/shift and biases")


@dataclass(frozen=True)
class LossConfig:
    label_smoothing: float = key(
        0.1, "--label-smoothing", "label smoothing epsilon", in_range(0, 1, "[0, 1)")
    )
    mixup_alpha: float = key(
        0.0, "--mixup-alpha", "MixUp Beta(alpha, alpha); 0 disables it", at_least(0)
    )
    class_weights: Optional[str] = key(
        None,
        "--class-weights",
        "weigh each class's images in the training loss: balanced (inverse class frequency "
        "in the training split, N / (classes x images of the class)) or a JSON / CSV file of "
        "weights by class name; the loss is then the weighted mean over the batch (label "
        "smoothing keeps an image's weight, MixUp blends the two images' weights)",
    )
    class_weights_from_epoch: int = key(
        1,
        "--class-weights-from-epoch",
        "deferred re-weighting (Cao et al. 2019): the plain loss before this epoch, "
        "--class-weights from it on (1: from the first step)",
        at_least(1),
    )
    logit_adjustment: float = key(
        0.0,
        "--logit-adjustment",
        "logit-adjusted loss (Menon et al. 2021): TAU x log(each class's share of the "
        "training split) added to the logits in the training loss only (evaluation and "
        "exports use them as they are); 1 is balanced softmax (Ren et al. 2020), 0 off",
        at_least(0),
    )


@dataclass(frozen=True)
class FinetuneConfig:
    frozen_stages: int = key(
        -1,
        "--frozen-stages",
        "freeze the stem (0), or the stem and the first N stages (N; a ResNet has 4, so 4 "
        "trains the classifier only): their weights and batch-norm statistics stay as "
        "loaded (-1: nothing frozen; MMPretrain's frozen_stages)",
        at_least(-1),
    )
    lr_mult_list: Tuple[float, ...] = key(
        (),
        "--lr-mult-list",
        "learning-rate multipliers of the stem and of each stage, in order (PaddleClas' "
        "lr_mult_list; a ResNet takes 5, e.g. 0.1,0.1,0.2,0.2,0.3); the classifier keeps "
        "the base rate (empty: 1 everywhere)",
        each(at_least(0)),
    )
