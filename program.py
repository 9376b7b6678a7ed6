"""Static train and eval programs for a ResNet, with Fleet AMP / ASP / data parallelism.

Programs are built in the legacy static IR: Fleet's static meta-optimizers do
not work under Paddle 3.x's PIR (see README, "Paddle versions").
"""
import os
from dataclasses import dataclass, field
from typing import Dict, Optional

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from paddle.distributed import fleet  # noqa: E402

from paddle_resnet.models import build_model  # noqa: E402
from paddle_resnet.optim import StepwiseLR, build_optimizer, set_weight_decay  # noqa: E402

TOP_K = 5


@dataclass
class Programs:
    """What the training loop runs. ``train`` is None when built for evaluation only."""

    startup: paddle.static.Program
    eval: paddle.static.Program
    model: paddle.nn.Layer
    train: Optional[paddle.static.Program] = None
    train_fetches: Dict[str, paddle.static.Variable] = field(default_factory=dict)
    eval_fetches: Dict[str, paddle.static.Variable] = field(default_factory=dict)
    lr_scheduler: Optional[StepwiseLR] = None
    optimizer: object = None


def input_shape(config):
    size = config.data.crop_size
    return [3, size, size] if config.model.data_layout == "NCHW" else [size, size, 3]


def init_fleet():
    """Fleet in collective mode: one process per device, whether launched or not."""
    if not fleet.fleet._role_maker:
        fleet.init(is_collective=True)


def distributed_strategy(config):
    strategy = fleet.DistributedStrategy()
    if config.amp.enabled:
        strategy.amp = True
        strategy.amp_configs = {
            "init_loss_scaling": config.amp.scale_loss,
            "use_dynamic_loss_scaling": config.amp.use_dynamic_loss_scaling,
            "use_pure_fp16": config.amp.use_pure_fp16,
            "use_fp16_guard": False,
        }
    strategy.asp = config.asp.enabled
    strategy.fuse_all_reduce_ops = True
    strategy.fuse_grad_size_in_MB = 16
    return strategy


def _train_head(logits, label, num_classes, label_smoothing):
    """Mean cross-entropy against smoothed one-hot targets, and batch top-1/top-5."""
    if label_smoothing > 0:
        # F.cross_entropy(label_smoothing=...) rejects int64 labels in static mode.
        one_hot = paddle.reshape(F.one_hot(label, num_classes), [-1, num_classes])
        target = F.label_smooth(one_hot, epsilon=label_smoothing)
        loss = F.cross_entropy(logits, target, soft_label=True)
    else:
        loss = F.cross_entropy(logits, label)
    k = min(TOP_K, num_classes)
    return {
        "loss": paddle.mean(loss),
        "top1": paddle.metric.accuracy(input=logits, label=label, k=1),
        f"top{k}": paddle.metric.accuracy(input=logits, label=label, k=k),
    }


def _eval_head(logits, label, num_classes):
    """Per-image loss and top-k classes, so the caller counts only real images;
    probabilities for the exported inference model."""
    _, top_classes = paddle.topk(logits, k=min(TOP_K, num_classes))
    return {"loss": F.cross_entropy(logits, label, reduction="none"), "topk": top_classes,
            "probs": F.softmax(logits)}


def build_programs(config, steps_per_epoch=None, global_batch=None, training=True):
    """The eval program, and with ``training`` the train program; they share parameters.

    The eval program is cloned from the forward pass before the optimizer is
    added, so both read the same parameter variables.
    """
    from paddle.incubate import asp

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = config.run.seed
    num_classes = config.model.num_classes
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        image = paddle.static.data("data", [None] + input_shape(config), "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        model = build_model(config.model)
        logits = model(image)
        eval_program = main.clone(for_test=True)
        programs = Programs(startup=startup, eval=eval_program, model=model)
        with paddle.static.program_guard(eval_program, startup):
            eval_logits = eval_program.global_block().var(logits.name)
            eval_label = eval_program.global_block().var(label.name)
            programs.eval_fetches = _eval_head(eval_logits, eval_label, num_classes)
        if not training:
            return programs

        programs.train_fetches = _train_head(logits, label, num_classes,
                                             config.loss.label_smoothing)
        set_weight_decay(main.all_parameters(), config.optimizer)
        scheduler = StepwiseLR(config.lr, steps_per_epoch, config.run.epochs, global_batch)
        optimizer = build_optimizer(config.optimizer, scheduler,
                                    multi_precision=config.amp.enabled and config.amp.use_pure_fp16)
        if config.asp.enabled:
            asp.set_excluded_layers(main_program=main, param_names=asp_excluded_parameters(model))
        init_fleet()
        optimizer = fleet.distributed_optimizer(optimizer, strategy=distributed_strategy(config))
        optimizer.minimize(programs.train_fetches["loss"], startup)
    programs.train = main
    programs.lr_scheduler = scheduler
    programs.optimizer = optimizer
    return programs


def asp_excluded_parameters(model):
    """Kept dense: the classifier, as in NVIDIA's recipe."""
    return [model.fc.weight.name]
