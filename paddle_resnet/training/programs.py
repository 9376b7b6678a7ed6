"""Static train and eval programs for a registered model, on either IR (``ir.py``).

The same code builds both; the strategies are Fleet's on the legacy IR, as in NVIDIA's
workflow, and the toolkit's on PIR (``pir_strategies.py``).
"""

import contextlib
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import paddle
import paddle.nn.functional as F
from paddle.distributed import fleet
from paddle.incubate import asp
from paddle.quantization import QAT

from paddle_resnet.core import bootstrap, devices, feeds, paddle_internals
from paddle_resnet.core.bootstrap import paddle_chatter
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.core.metrics import top_k
from paddle_resnet.models import build_model, model_entry
from paddle_resnet.training import cpu_ops, distributed, finetune, gpu_tuning, ir, pir_strategies
from paddle_resnet.training.onednn import mark_for_onednn, onednn_wanted
from paddle_resnet.training.optim import StepwiseLR, build_optimizer, set_weight_decay
from paddle_resnet.training.qat import FLEET_QAT_CONFIGS, name_qat_variables
from paddle_resnet.training.sparsity.masks import enforce_masks, excluded_parameters
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX


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
    mixup_feed: Optional[str] = None  # the MixUp weight's feed, if any
    # The per-class vectors the train program takes (feeds.CLASS_WEIGHTS with
    # --class-weights, feeds.LOGIT_OFFSETS with --logit-adjustment): class_weights.ClassBalance
    class_feeds: Tuple[str, ...] = ()
    # On GPUs the eval program compiled with NVIDIA's build strategy; run it instead of eval.
    eval_compiled: Optional[paddle.static.CompiledProgram] = None
    soft_target: Optional[paddle.static.Variable] = None  # the training target, for tests


# The quantizers of QAT: Fleet's (quantize_linear) and paddle.quantization's.
QUANTIZER_OPS = {
    "quantize_linear",
    "fake_quantize_dequantize_abs_max",
    "fake_quantize_dequantize_moving_average_abs_max",
    "fake_channel_wise_quantize_dequantize_abs_max",
}


def input_shape(config):
    size, channels = config.data.crop_size, config.model.image_channels
    return [channels, size, size] if config.model.data_layout == "NCHW" else [size, size, channels]


def distributed_strategy(config, on_gpu):
    strategy = fleet.DistributedStrategy()
    if on_gpu:
        strategy.build_strategy = gpu_tuning.build_strategy(config, training=True)
        for name, value in gpu_tuning.fleet_fields(config).items():
            setattr(strategy, name, value)
    if config.amp.enabled:
        strategy.amp = True
        strategy.amp_configs = {
            "init_loss_scaling": config.amp.scale_loss,
            "use_dynamic_loss_scaling": config.amp.use_dynamic_loss_scaling,
            "use_pure_fp16": config.amp.use_pure_fp16,
            "use_fp16_guard": config.amp.use_pure_fp16,
        }
    # Fleet applied ASP and silently dropped QAT with both asked, and masks only weights
    # with gradients (frozen stages): there the toolkit keeps the masks (enforce_masks).
    strategy.asp = (
        config.asp.enabled and not config.qat.enabled and config.finetune.frozen_stages < 0
    )
    if config.qat.enabled:
        strategy.qat = True
        strategy.qat_configs = FLEET_QAT_CONFIGS
    # Recorded for Fleet; the batch norms themselves are converted in _forward, because
    # Fleet 2.6's static collective path (RawProgramOptimizer) does not read the flag.
    strategy.sync_batch_norm = config.run.sync_bn
    strategy.fuse_all_reduce_ops = True
    strategy.fuse_grad_size_in_MB = 16
    return strategy


def _train_head(
    logits, label, num_classes, label_smoothing, mixup_lambda, class_weights, logit_offsets=None
):
    """(fetches, soft target or None): mean cross-entropy against smoothed, MixUp-blended
    targets, weighted by ``class_weights``, of the logits plus ``logit_offsets`` (fed
    vectors or None); batch top-1/top-k of the logits as they are."""
    target = None
    reduction = "mean" if class_weights is None else "none"
    # the offsets broadcast over the batch; the metrics and the eval program see none
    scores = logits if logit_offsets is None else logits + logit_offsets
    if label_smoothing > 0 or mixup_lambda is not None:
        # F.cross_entropy(label_smoothing=...) rejects int64 labels in static mode.
        target = paddle.reshape(F.one_hot(label, num_classes), [-1, num_classes])
        if label_smoothing > 0:
            target = F.label_smooth(target, epsilon=label_smoothing)
        if mixup_lambda is not None:
            target = mixup_lambda * target + (1.0 - mixup_lambda) * paddle.flip(target, [0])
        loss = F.cross_entropy(scores, target, soft_label=True, reduction=reduction)
    else:
        loss = F.cross_entropy(scores, label, reduction=reduction)
    if class_weights is not None:
        weight = paddle.reshape(paddle.gather(class_weights, paddle.reshape(label, [-1])), [-1, 1])
        if mixup_lambda is not None:
            weight = mixup_lambda * weight + (1.0 - mixup_lambda) * paddle.flip(weight, [0])
        loss = paddle.mean(loss * weight) / paddle.mean(weight)
    k = top_k(num_classes)
    fetches = {
        "loss": paddle.mean(loss),
        "top1": paddle.metric.accuracy(input=logits, label=label, k=1),
        f"top{k}": paddle.metric.accuracy(input=logits, label=label, k=k),
    }
    return fetches, target


def _eval_head(logits, label, num_classes):
    """Per-image loss and top-k classes, so the caller counts only real images;
    probabilities for the exported inference model."""
    _, top_classes = paddle.topk(logits, k=top_k(num_classes))
    return {
        "loss": F.cross_entropy(logits, label, reduction="none"),
        "topk": top_classes,
        "probs": F.softmax(logits),
    }


def _forward(config, mixup, training, sync_bn=False, optimizer=None, pir_amp=False):
    """Model, label, logits, MixUp weight and optimizer. ``mixup``: the images blended with
    the batch reversed by a fed weight; ``pir_amp``: the model and ``optimizer`` decorated
    before the forward pass, the logits leaving it in fp32."""
    fp16_input = config.data.output_fp16
    image = paddle.static.data(
        feeds.IMAGE, [None] + input_shape(config), "float16" if fp16_input else "float32"
    )
    # fp16 from DALI goes straight into fp16 convolutions; fp32 ones and MixUp get a cast.
    fp16_convolutions = config.amp.enabled and (training or config.amp.use_pure_fp16)
    if fp16_input and (mixup or not fp16_convolutions):
        image = paddle.cast(image, "float32")
    label = paddle.static.data(feeds.LABEL, [None, 1], "int64")
    model = build_model(config.model, cpu_ops.for_program(config, training))
    if config.qat.enabled and ir.is_pir(config):  # legacy: Fleet's QAT pass, after building
        model = QAT(paddle_internals.pir_qat_config()).quantize(model, inplace=True)
    if not training and ir.is_pir(config):
        model.eval()  # batch norm on its running statistics (legacy: clone(for_test=True))
    if sync_bn:
        model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if training:
        finetune.apply(model, model_entry(config.model.arch).family, config.finetune)
    if pir_amp:
        model, optimizer = pir_strategies.mixed_precision(model, optimizer, config.amp)
    mixup_lambda = None
    if mixup:
        mixup_lambda = paddle.static.data(feeds.MIXUP_LAMBDA, [1], "float32")
        image = mixup_lambda * image + (1.0 - mixup_lambda) * paddle.flip(image, [0])
    with _network_precision(config, pir_amp):
        logits = model(image)
    if pir_amp:
        logits = paddle.cast(logits, "float32")
    return model, label, logits, mixup_lambda, optimizer


def _network_precision(config, pir_amp):
    """Where the network is built: PIR's ``auto_cast``; legacy pure fp16's fp16_guard
    (the loss, its targets and the metrics stay fp32)."""
    if pir_amp:
        return pir_strategies.autocast(config.amp)
    if config.amp.use_pure_fp16:
        return paddle.static.amp.fp16_guard()
    return contextlib.nullcontext()


def applied_strategies(program, meta_optimizers=()):
    """The strategies whose ops are in the train ``program`` (what ran, not what was
    asked); AMP also by Fleet's ``meta_optimizers`` (on the CPU build its static loss
    scale leaves no op)."""
    types = set(ir.op_types(program))
    return {
        "AMP": (
            "AMPOptimizer" in meta_optimizers
            or bool({"check_finite_and_unscale", "update_loss_scaling"} & types)
            or ir.computes_in_low_precision(program)
        ),
        "ASP": ir.masks_applied(program, MASK_SUFFIX),
        "QAT": bool(QUANTIZER_OPS & types),
        "data parallelism": bool({"c_allreduce_sum", "all_reduce", "all_reduce_"} & types),
    }


def check_strategies_applied(config, program):
    """ConfigError naming each strategy that was asked for but is not in ``program``:
    Fleet picks meta-optimizers by its own lists and drops the rest without a word."""
    wanted = {
        "AMP": config.amp.enabled,
        "ASP": config.asp.enabled,
        "QAT": config.qat.enabled,
        "data parallelism": fleet.worker_num() > 1,
    }
    applied = applied_strategies(program, paddle_internals.applied_meta_optimizers())
    dropped = [name for name, asked in wanted.items() if asked and not applied[name]]
    if dropped:
        raise ConfigError(
            f"Fleet (Paddle {paddle.__version__}) did not apply "
            f"{', '.join(dropped)} to the train program: this combination of "
            "options cannot run"
        )


def _fleet_minimize(config, optimizer, programs, main, startup, on_gpu, kept_dense):
    """The legacy IR's strategies, by Fleet: AMP, ASP, QAT, data parallelism (and the
    GPU fusions); returns Fleet's optimizer."""
    if config.asp.enabled:
        asp.set_excluded_layers(main_program=main, param_names=kept_dense)
    distributed.init_fleet()
    if on_gpu:
        gpu_tuning.apply_cudnn_flags()
    strategy = distributed_strategy(config, on_gpu)
    optimizer = fleet.distributed_optimizer(optimizer, strategy=strategy)
    # fleet prints its optimizer choice; CPU ranks talk through gloo
    with (
        paddle_chatter(bootstrap.verbose()),
        distributed.collective_rewrite(main, startup),
        gpu_tuning.passes_applied(on_gpu),
    ):
        optimizer.minimize(programs.train_fetches["loss"], startup)
    if config.asp.enabled and not strategy.asp:
        enforce_masks(main, startup)
    check_strategies_applied(config, main)
    if config.qat.enabled:
        name_qat_variables(main)
    if config.amp.fuse_resunit:
        gpu_tuning.fuse_resunits(main, startup)
    return optimizer


def build_programs(config, steps_per_epoch=None, global_batch=None, training=True, on_gpu=None):
    """The eval program, and with ``training`` the train program (``on_gpu``: NVIDIA's
    settings). Each under a fresh unique-name guard: the same parameter names, so the
    two share their parameters through the scope."""
    paddle.enable_static()
    ir.check(config)
    pir = ir.is_pir(config)
    on_gpu = devices.gpu_available() if on_gpu is None else on_gpu
    gpu_tuning.check_resunit(config, on_gpu)
    finetune.check(config.finetune, model_entry(config.model.arch).family, config.model.arch)
    num_classes = config.model.num_classes
    eval_main, eval_startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(eval_main, eval_startup), paddle.utils.unique_name.guard():
        # In a training run under O2 the eval program reads the low-precision weights
        # too; O1 evaluates in fp32 as the legacy IR does, and so do exports.
        model, label, logits, _, _ = _forward(
            config,
            mixup=False,
            training=False,
            pir_amp=pir and training and config.amp.enabled and config.amp.use_pure_fp16,
        )
        eval_fetches = _eval_head(logits, label, num_classes)
    # PIR's clone has no for_test: the model was built in eval mode
    eval_program = eval_main if pir else eval_main.clone(for_test=True)
    eval_fetches = {name: ir.fetch_target(eval_program, var) for name, var in eval_fetches.items()}
    programs = Programs(
        startup=eval_startup, eval=eval_program, model=model, eval_fetches=eval_fetches
    )
    if on_gpu and not pir:
        programs.eval_compiled = paddle.static.CompiledProgram(
            eval_program, build_strategy=gpu_tuning.build_strategy(config, training=False)
        )
    if not training:
        return programs

    main, startup = paddle.static.Program(), paddle.static.Program()
    ir.seed(main, startup, config.run.seed)
    # Before the model: PIR's AMP decorates the optimizer with the model.
    scheduler = StepwiseLR(config.lr, steps_per_epoch, config.run.epochs, global_batch)
    optimizer = build_optimizer(
        config.optimizer, scheduler, multi_precision=config.amp.enabled and config.amp.use_pure_fp16
    )
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
        model, label, logits, mixup_lambda, optimizer = _forward(
            config,
            mixup=config.loss.mixup_alpha > 0,
            training=True,
            sync_bn=config.run.sync_bn,
            optimizer=optimizer,
            pir_amp=pir and config.amp.enabled,
        )
        class_inputs = {
            name: paddle.static.data(name, [num_classes], "float32") if wanted else None
            for name, wanted in (
                (feeds.CLASS_WEIGHTS, config.loss.class_weights),
                (feeds.LOGIT_OFFSETS, config.loss.logit_adjustment > 0),
            )
        }
        programs.train_fetches, programs.soft_target = _train_head(
            logits,
            label,
            num_classes,
            config.loss.label_smoothing,
            mixup_lambda,
            class_inputs[feeds.CLASS_WEIGHTS],
            class_inputs[feeds.LOGIT_OFFSETS],
        )
        set_weight_decay(ir.parameters(main), config.optimizer)
        family = model_entry(config.model.arch).family
        dense = family.dense_under_sparsity + config.asp.exclude
        kept_dense = excluded_parameters(model, dense) if config.asp.enabled else []
        if pir:
            pir_strategies.minimize(config, optimizer, programs.train_fetches["loss"], kept_dense)
        else:
            optimizer = _fleet_minimize(
                config, optimizer, programs, main, startup, on_gpu, kept_dense
            )
    programs.startup, programs.train, programs.model = startup, main, model
    programs.lr_scheduler, programs.optimizer = scheduler, optimizer
    programs.mixup_feed = feeds.MIXUP_LAMBDA if mixup_lambda is not None else None
    programs.class_feeds = tuple(name for name, value in class_inputs.items() if value is not None)
    if onednn_wanted(config):
        # Not the eval program: oneDNN's inference-mode convolutions cache their reordered
        # weights, and evaluation between epochs then saw stale ones (measured: 61 % top-1
        # where the same checkpoint evaluated plain gave 85 %).
        mark_for_onednn(main, family.onednn_training_ops)
    return programs
