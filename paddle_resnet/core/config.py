"""The one configuration object: defaults < YAML recipe < --set < command-line flags.

Each key is declared once, as a field of a frozen section dataclass made by ``key``:
its default, its flag (and aliases), its help text and its check. The validation here
and each tool's command line and the flag table (docs/flags.md) (``paddle_resnet/core/cli.py``) are
generated from those fields. ``build_config`` makes the Config once; builders then take
the section they need (``build_model(config.model)``).
"""

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Optional, Tuple

import yaml

from paddle_resnet.core import trackers
from paddle_resnet.core.bootstrap import FALSE_WORDS, TRUE_WORDS, VERBOSE_FLAG
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.core.text_files import read_text

# configs/ of the repository: paddle_resnet/core/config.py is three levels below it
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_DIR = os.path.join(REPOSITORY, "configs")
RUN_SCOPES = ("train_eval", "train_only", "eval_only")
IRS = ("legacy", "pir")
LR_SCHEDULES = ("cosine", "step")
# The sparsity mask algorithms, by the names of their functions in
# training/sparsity/pattern.py (declared here, where the config checks --mask-algo).
MASK_ALGOS = ("mask_1d", "mask_2d_greedy", "mask_2d_best")
DATA_LAYOUTS = ("NCHW", "NHWC")
# serve: the export over the Open Inference Protocol (paddle-resnet-serve, deploy/serve.py)
INFERENCE_MODES = ("accuracy", "benchmark", "predict", "serve")
TRT_PRECISIONS = ("FP32", "FP16", "INT8")
CPU_PRECISIONS = ("fp32", "bf16", "int8")
PTQ_ALGOS = ("KL", "hist", "mse", "avg", "abs_max")
AMP_DTYPES = ("float16", "bfloat16")
# --sampling: how a training epoch draws the images of an image tree (data/dali.py)
SAMPLINGS = ("shuffle", "class-balanced")
DEFAULT_INFERENCE_DIR = "./inference"

# The tools that read a key, declared on the key (``key(..., tools=...)``): each tool's
# command line takes exactly the flags of the keys it reads and refuses the others.
TOOLS = ("train", "export_model", "inference", "check_data", "serve")
TRAIN = ("train",)
EXPORT = ("export_model",)
INFERENCE = ("inference",)
CHECK_DATA = ("check_data",)
TRAIN_EXPORT = ("train", "export_model")
TRAIN_INFERENCE = ("train", "inference")
EXPORT_INFERENCE = ("export_model", "inference")
SERVE = ("serve",)
MODEL_TOOLS = ("train", "export_model", "inference")
ALL_TOOLS = TOOLS
# the tools that read image trees (every tool but the server, which is sent its images)
IMAGE_TOOLS = ("train", "export_model", "inference", "check_data")


# ---------------------------------------------------------------- checks of one value
# Each returns None when the value is fine, else what is wrong ("must be ..., got ...").


def at_least(low):
    return lambda v: None if v >= low else f"must be at least {low}, got {v}"


def positive(v):
    return None if v > 0 else f"must be positive, got {v}"


def in_range(low, high, text):
    """``low <= v < high``, described by ``text`` such as "[0, 1)"."""
    return lambda v: None if low <= v < high else f"must be in {text}, got {v}"


def each(check):
    return lambda values: next((problem for problem in map(check, values) if problem), None)


def nonempty(values):
    return None if values else "needs at least one value"


def key(
    default,
    flag,
    help,
    check=None,
    choices=None,
    aliases=(),
    deprecated=(),
    resume_may_change=False,
    tools=TRAIN,
    repeatable=False,
):
    """A config field: its default, flag, help text, check and alias flags, and the
    ``tools`` that read it (each a name in TOOLS).
    ``deprecated`` aliases still work but print a warning naming ``flag``.
    ``resume_may_change``: a resumed run may set another value than the checkpoint's
    run (where files go, how often to log); every other key must match.
    ``repeatable``: a tuple whose flag may be given again, adding its values."""
    return field(
        default=default,
        metadata={
            "flag": flag,
            "help": help,
            "check": check,
            "choices": choices,
            "aliases": tuple(aliases),
            "deprecated": tuple(deprecated),
            "resume_may_change": resume_may_change,
            "tools": tools,
            "repeatable": repeatable,
        },
    )


@dataclass(frozen=True)
class RunConfig:
    output_dir: str = key(
        "./output",
        "--output-dir",
        "folder for checkpoints, reports and the class index",
        aliases=("--checkpoint-dir",),
        resume_may_change=True,
    )
    run_scope: str = key(
        "train_eval", "--run-scope", "what to run", choices=RUN_SCOPES, resume_may_change=True
    )
    epochs: int = key(
        90,
        "--epochs",
        "number of training epochs (a resumed run may extend "
        "them: the LR schedule then spans the new total)",
        at_least(1),
        resume_may_change=True,
    )
    save_interval: int = key(
        1,
        "--save-interval",
        "save a checkpoint every N epochs",
        at_least(1),
        resume_may_change=True,
    )
    save_every_minutes: float = key(
        0.0,
        "--save-every-minutes",
        "also save a checkpoint within an epoch once M minutes have passed since the last "
        "save (the ranks agree at a step), so a node lost without warning costs at most M "
        "minutes (0: at epoch ends and on a stop only)",
        at_least(0),
        resume_may_change=True,
    )
    keep_checkpoints: int = key(
        0,
        "--keep-checkpoints",
        "keep the newest N epoch checkpoints and remove older ones, and any mid-epoch "
        "checkpoint once a later one is saved (0: keep all)",
        at_least(0),
        resume_may_change=True,
    )
    eval_interval: int = key(
        1,
        "--eval-interval",
        "validate every N epochs (and after the last)",
        at_least(1),
        resume_may_change=True,
    )
    print_interval: int = key(
        10, "--print-interval", "log every N steps", at_least(1), resume_may_change=True
    )
    report_file: Optional[str] = key(
        None,
        "--report-file",
        "JSON-lines report (default <output-dir>/report.json)",
        resume_may_change=True,
    )
    benchmark: bool = key(
        False,
        "--benchmark",
        "measure throughput only: warm-up steps, then timed steps",
        resume_may_change=True,
    )
    benchmark_steps: int = key(
        100,
        "--benchmark-steps",
        "timed steps in benchmark mode",
        at_least(1),
        resume_may_change=True,
        tools=TRAIN_INFERENCE,
    )
    benchmark_warmup_steps: int = key(
        100,
        "--benchmark-warmup-steps",
        "untimed steps in benchmark mode",
        at_least(0),
        resume_may_change=True,
        tools=TRAIN_INFERENCE,
    )
    from_checkpoint: Optional[str] = key(
        None,
        "--from-checkpoint",
        "checkpoint folder to resume from (<output-dir>/<arch>/<epoch>, or <output-dir>/<arch> "
        "for its newest), or auto: the newest checkpoint of this run in --output-dir if there "
        "is one, else a fresh start (a job restarted by its scheduler with the same command "
        "continues)",
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    last_epoch_of_checkpoint: Optional[str] = key(
        None,
        "--last-epoch-of-checkpoint",
        "with --from-checkpoint <output-dir>/<arch>: the "
        "epoch to resume from (auto or unset: the newest)",
        lambda v: (
            None
            if v == "auto" or (v.isdigit() and int(v) >= 1)
            else f"must be auto or an epoch >= 1, got {v!r}"
        ),
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    model_prefix: str = key(
        "model",
        "--model-prefix",
        "file name prefix of checkpoint "
        "parameters (<prefix>.pdparams); --from-pretrained-params FOLDER "
        "reads FOLDER/<prefix>.pdparams",
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    from_pretrained_params: Optional[str] = key(
        None,
        "--from-pretrained-params",
        "parameters to start from: this toolkit's .pdparams (or its prefix), a torchvision/"
        "timm state dict (.pth/.pt, .safetensors) or a PaddleClas .pdparams, recognised by "
        "content; a classifier of another class count is skipped",
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    trackers: Tuple[str, ...] = key(
        (),
        "--tracker",
        "experiment trackers that also get the run (rank 0's; repeatable): tensorboard "
        "(--tensorboard-log-dir), mlflow (--mlflow-tracking-uri), visualdl "
        "(--visualdl-log-dir): the report's scalars, each class's accuracy and the "
        "confusion matrix at each validation, the config as parameters, the checkpoints "
        "saved; a resumed run continues the tracker's run",
        each(trackers.unusable),
        resume_may_change=True,
        repeatable=True,
    )
    tensorboard_log_dir: Optional[str] = key(
        None,
        "--tensorboard-log-dir",
        "TensorBoard's folder with --tracker tensorboard (default <output-dir>/tensorboard; "
        "view with: tensorboard --logdir DIR)",
        resume_may_change=True,
    )
    mlflow_tracking_uri: Optional[str] = key(
        None,
        "--mlflow-tracking-uri",
        "MLflow's tracking URI with --tracker mlflow (a server's http://HOST:PORT, a "
        "database); default MLFLOW_TRACKING_URI, else a local store without a server, "
        "sqlite:///<output-dir>/mlflow.db (view with: mlflow ui --backend-store-uri URI)",
        resume_may_change=True,
    )
    visualdl_log_dir: Optional[str] = key(
        None,
        "--visualdl-log-dir",
        "VisualDL's folder; giving it turns the visualdl tracker on (default with "
        "--tracker visualdl: <output-dir>/visualdl; view with: visualdl --logdir DIR)",
        lambda _: trackers.unusable("visualdl"),
        resume_may_change=True,
    )
    seed: int = key(42, "--seed", "random seed of parameter initialisation")
    cpu_onednn: Optional[bool] = key(
        None,
        "--cpu-onednn",
        "oneDNN kernels for the convolutions and ReLUs of CPU training "
        "(--no-cpu-onednn: Paddle's plain kernels; unset: whichever trains this model and shape "
        "faster on this machine, measured once and kept in ~/.cache/paddle-resnet; "
        "no effect on GPUs)",
        resume_may_change=True,
    )
    cpu_affinity: bool = key(
        True,
        "--enable-cpu-affinity",
        "pin each GPU rank to the CPU cores nvidia-smi topo -m gives its "
        "GPU (no effect without GPUs)",
        resume_may_change=True,
    )
    profile_start_step: Optional[int] = key(
        None,
        "--profile-start-step",
        "profile training steps from this global step (Paddle "
        "profiler trace in <output-dir>/profile; NVTX ranges and the CUDA profiler window "
        "for nsys on GPUs)",
        at_least(0),
        resume_may_change=True,
    )
    profile_stop_step: Optional[int] = key(
        None,
        "--profile-stop-step",
        "first step no longer profiled (default: start + 10)",
        at_least(1),
        resume_may_change=True,
    )
    start_timeout: int = key(
        1800,
        "--start-timeout",
        "ranks of paddle.distributed.launch: seconds the start may take (everything "
        "before the first step: the ranks' rendezvous, data check, programs, weights); a "
        "rank past it ends with one line naming its phase (0: no deadline)",
        at_least(0),
        resume_may_change=True,
    )
    collective_timeout: int = key(
        1800,
        "--collective-timeout",
        "multi-rank jobs: seconds a rank may go without "
        "progress (a step, an evaluation batch) before it ends the job, naming the stuck "
        "rank (NCCL's customary 30 minutes; longer than any checkpoint save)",
        at_least(1),
        resume_may_change=True,
    )
    sync_bn: bool = key(
        False,
        "--sync-bn",
        "batch-norm statistics over all ranks (Fleet sync_batch_norm; GPUs only)",
    )
    ir: Optional[str] = key(
        None,
        "--ir",
        "Paddle's static graph to build on: legacy (Fleet's AMP, ASP, QAT and data "
        "parallelism; the only one on Paddle 2.6) or pir (Paddle 3.x; the toolkit's own "
        "2:4 masks, int8 through model.onnx; exports inference.json); unset: pir on Paddle "
        "3 but for GPUs, multi-process CPU jobs and legacy-only "
        "options, each said in one line",
        choices=IRS,
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    verbose: bool = key(
        False,
        VERBOSE_FLAG,
        "show Paddle's own log lines, warnings and prints (hidden by default)",
        resume_may_change=True,
        tools=ALL_TOOLS,
    )


@dataclass(frozen=True)
class DataConfig:
    image_root: Optional[str] = key(
        None,
        "--image-root",
        "folder holding train/<class>/*.jpg and val/<class>/*.jpg "
        "(or the record files, with --data-format)",
        resume_may_change=True,
        tools=IMAGE_TOOLS,
    )
    format: str = key(
        "folder",
        "--data-format",
        "input format: an image tree (folder) or a record format of data/records.py "
        "(scripts/data/make_records.py writes them)",
        resume_may_change=True,
        tools=IMAGE_TOOLS,
    )
    batch_size: int = key(
        256,
        "--batch-size",
        "images per device per step (training and evaluation)",
        at_least(1),
        tools=MODEL_TOOLS,
    )
    seed: int = key(42, "--dali-random-seed", "seed of DALI shuffling and augmentation")
    output_fp16: bool = key(
        False,
        "--dali-output-fp16",
        "DALI outputs fp16 images (pure fp16 "
        "training reads them as they are; otherwise the program casts them "
        "to fp32)",
    )
    num_threads: int = key(
        0,
        "--dali-num-threads",
        "DALI threads per process (0: all cores)",
        at_least(0),
        resume_may_change=True,
        tools=IMAGE_TOOLS,
    )
    crop_size: int = key(
        224,
        "--crop-size",
        "side of the square network input",
        at_least(8),
        tools=TRAIN_EXPORT + CHECK_DATA,
    )
    resize_short: int = key(
        256,
        "--resize-short",
        "validation: shorter side before the centre crop",
        at_least(8),
        tools=TRAIN_EXPORT,
    )
    rand_crop_scale: Tuple[float, float] = key(
        (0.08, 1.0),
        "--rand-crop-scale",
        "training crop area range, e.g. 0.08,1",
        lambda v: None if 0 < v[0] <= v[1] <= 1 else f"must satisfy 0 < min <= max <= 1, got {v}",
    )
    rand_crop_ratio: Tuple[float, float] = key(
        (3.0 / 4.0, 4.0 / 3.0),
        "--rand-crop-ratio",
        "training crop aspect-ratio range, e.g. 0.75,1.333",
        lambda v: None if 0 < v[0] <= v[1] else f"must satisfy 0 < min <= max, got {v}",
    )
    sampling: str = key(
        "shuffle",
        "--sampling",
        "training images of an epoch: shuffle (each image once) or class-balanced (every "
        "class drawn equally often: a rare class's images repeat, a common one's are "
        "fewer; the epoch keeps its length; image trees only)",
        choices=SAMPLINGS,
    )
    color_jitter: Tuple[float, float, float] = key(
        (0.0, 0.0, 0.0),
        "--color-jitter",
        "training ColorJitter strengths: brightness,contrast,saturation (e.g. 0.4,0.4,0.4)",
        each(in_range(0, 1, "[0, 1)")),
    )
    normalize_scale: float = key(
        1.0 / 255.0,
        "--normalize-scale",
        "the pixel scale that "
        "--normalize-mean and --normalize-std refer to (1/255: the 0-1 "
        "scale; 1: pixel values)",
        positive,
        tools=TRAIN_EXPORT,
    )
    normalize_mean: Tuple[float, float, float] = key(
        (0.485, 0.456, 0.406),
        "--normalize-mean",
        "per-channel mean (0-1 scale)",
        tools=TRAIN_EXPORT,
    )
    normalize_std: Tuple[float, float, float] = key(
        (0.229, 0.224, 0.225),
        "--normalize-std",
        "per-channel std (0-1 scale)",
        each(positive),
        tools=TRAIN_EXPORT,
    )


@dataclass(frozen=True)
class ModelConfig:
    arch: str = key(
        "resnet50",
        "--model-arch-name",
        "registered architecture, e.g. resnet50, resnext101_32x4d",
        tools=TRAIN_EXPORT,
    )
    num_classes: int = key(
        1000,
        "--num-of-class",
        "number of classes (must match the data)",
        at_least(2),
        tools=TRAIN_EXPORT,
    )
    data_layout: str = key(
        "NCHW", "--data-layout", "tensor layout", choices=DATA_LAYOUTS, tools=TRAIN_EXPORT
    )
    image_channels: int = key(
        3,
        "--image-channels",
        "input channels: 3 (RGB), or 4 (RGB and a "
        "zero channel padded by DALI, so NHWC fp16 convolutions get "
        "tensor-core friendly shapes; --image-shape 4,224,224)",
        choices=(3, 4),
        tools=TRAIN_EXPORT,
    )
    zero_init_residual: bool = key(
        False,
        "--zero-init-residual",
        "zero gamma in each block's last BN",
        tools=TRAIN_EXPORT,
    )


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
        "cuDNN v8 ResUnit fusion of the training "
        "program (with --amp; needs a Paddle built with the cuDNN frontend, "
        "e.g. NGC 23.12+)",
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


@dataclass(frozen=True)
class CheckConfig:
    at_start: bool = key(
        True,
        "--data-check",
        "check an image tree at the start of a run, as paddle-resnet-check-data's fast pass "
        "does (counts, broken files, colour modes, sizes, train/val duplicates; about 0.1 ms "
        "an image), its findings printed as warnings (--no-data-check: skip it; broken "
        "images and empty class folders are refused either way)",
        resume_may_change=True,
    )
    decode: bool = key(
        False,
        "--decode",
        "paddle-resnet-check-data: also decode every image with DALI on the CPU as training "
        "does (--dali-num-threads threads), and say at what rate",
        resume_may_change=True,
        tools=CHECK_DATA,
    )
    json_path: Optional[str] = key(
        None,
        "--json",
        "paddle-resnet-check-data: also write the counts and findings to this JSON file",
        resume_may_change=True,
        tools=CHECK_DATA,
    )


@dataclass(frozen=True)
class InferenceConfig:
    model_dir: Optional[str] = key(
        None,
        "--inference-dir",
        f"inference model folder: export_model.py writes it, "
        f"inference.py reads it (default {DEFAULT_INFERENCE_DIR}); train.py exports the final "
        "model there when given",
        aliases=("--trt-inference-dir",),
        tools=MODEL_TOOLS + SERVE,
    )
    backend: str = key(
        "auto",
        "--backend",
        "predictor backend, a name in deploy/backends.py (auto: trt on GPU machines; on "
        "CPUs openvino where it is installed and the export was verified on it "
        "(export_model.py --verify-images), cpu otherwise; cpu is Paddle Inference with "
        "oneDNN; openvino and onnxruntime need pip install openvino / onnxruntime)",
        tools=INFERENCE + SERVE,
    )
    mode: str = key(
        "benchmark", "--mode", "what inference.py does", choices=INFERENCE_MODES, tools=INFERENCE
    )
    images: Tuple[str, ...] = key(
        (), "--images", "predict: comma-separated image files or folders", tools=INFERENCE
    )
    batch_sizes: Tuple[int, ...] = key(
        (1, 32),
        "--benchmark-batch-sizes",
        "benchmark: comma-separated batch sizes",
        lambda v: nonempty(v) or each(at_least(1))(v),
        tools=INFERENCE,
    )
    device_id: int = key(
        0, "--device", "GPU of the gpu and trt backends", at_least(0), tools=INFERENCE
    )
    trt_precision: str = key(
        "FP32",
        "--trt-precision",
        "TensorRT precision",
        choices=TRT_PRECISIONS,
        aliases=("--precision",),
        tools=INFERENCE,
    )
    trt_workspace_size: int = key(
        1024,
        "--trt-workspace-size",
        "TensorRT workspace in MB (a "
        "value of 2^20 or more is taken as bytes, as NVIDIA's scripts "
        "pass it)",
        at_least(1),
        aliases=("--workspace-size",),
        tools=INFERENCE,
    )
    trt_min_subgraph_size: int = key(
        3,
        "--trt-min-subgraph-size",
        "smallest subgraph handed to TensorRT",
        at_least(1),
        aliases=("--min-subgraph-size",),
        tools=INFERENCE,
    )
    trt_use_static: bool = key(
        False,
        "--trt-use-static",
        "serialize TensorRT engines for reuse",
        aliases=("--use-static",),
        tools=INFERENCE,
    )
    trt_use_calib_mode: bool = key(
        False,
        "--trt-use-calib-mode",
        "INT8: calibrate on validation images (post-training quantization)",
        aliases=("--use-calib-mode",),
        tools=INFERENCE,
    )
    use_synthetic: bool = key(
        False,
        "--use-synthetic",
        "benchmark on synthetic input",
        deprecated=("--trt-use-synthat",),
        tools=INFERENCE,
    )
    cpu_precision: str = key(
        "fp32",
        "--cpu-precision",
        "CPU precision of the cpu and openvino backends",
        choices=CPU_PRECISIONS,
        tools=EXPORT_INFERENCE + SERVE,
    )
    cpu_threads: int = key(
        0,
        "--cpu-threads",
        "CPU math threads (0: all cores)",
        at_least(0),
        tools=EXPORT_INFERENCE + SERVE,
    )
    ptq_algo: Optional[str] = key(
        None,
        "--ptq-algo",
        "export_model.py: quantize the exported "
        "model to INT8 after training (post-training quantization), "
        "calibrating activation ranges with this algorithm",
        choices=PTQ_ALGOS,
        tools=EXPORT,
    )
    onnx: bool = key(
        False,
        "--onnx",
        "export_model.py: also write model.onnx (paddle2onnx, "
        "opset 13) beside the Paddle model, fp32 or quantized",
        tools=EXPORT,
    )
    openvino: bool = key(
        False,
        "--openvino",
        "export_model.py: also write OpenVINO's model "
        "(openvino/model.xml, what --backend openvino reads; pip install "
        "openvino)",
        tools=EXPORT,
    )
    verify_images: int = key(
        0,
        "--verify-images",
        "export_model.py: run the export on this "
        "many validation images through every backend and precision this "
        "machine has, against the fp32 Paddle predictor; fail on "
        "disagreement (0: no check)",
        at_least(0),
        tools=EXPORT,
    )
    calibration_images: int = key(
        512,
        "--calibration-images",
        "export_model.py --ptq-algo: training images (validation preprocessing) to calibrate on",
        at_least(1),
        tools=EXPORT,
    )
    log_path: str = key(
        "./inference.json",
        "--inference-log-path",
        "JSON-lines inference report",
        aliases=("--trt-log-path",),
        tools=INFERENCE,
    )
    export_log_path: str = key(
        "./export.json",
        "--export-log-path",
        "JSON export report",
        aliases=("--trt-export-log-path",),
        tools=EXPORT,
    )

    @property
    def directory(self):
        """The inference model folder, given or default."""
        return self.model_dir or DEFAULT_INFERENCE_DIR


@dataclass(frozen=True)
class ServeConfig:
    model_name: Optional[str] = key(
        None,
        "--model-name",
        "the model's name on the endpoints (/v2/models/NAME); default: the export folder's name",
        tools=SERVE,
    )
    http_port: int = key(
        8080, "--http-port", "REST port", in_range(1, 65536, "[1, 65535]"), tools=SERVE
    )
    grpc_port: int = key(
        8081, "--grpc-port", "gRPC port", in_range(1, 65536, "[1, 65535]"), tools=SERVE
    )
    max_batch: int = key(
        32,
        "--max-batch",
        "largest batch run at once: requests that arrive together run as one batch of at "
        "most this many images; a request may hold at most this many",
        at_least(1),
        tools=SERVE,
    )
    max_wait_ms: float = key(
        2.0,
        "--max-wait-ms",
        "how long the first request of a batch waits for others to join it (milliseconds)",
        at_least(0),
        tools=SERVE,
    )
    max_request_mb: float = key(
        64.0,
        "--max-request-mb",
        "largest request: a REST body or gRPC message above it is refused (413, "
        "RESOURCE_EXHAUSTED)",
        positive,
        tools=SERVE,
    )


def section(keys, title):
    """A section of the Config: the dataclass of its keys, and its title, which heads its
    flags in each tool's --help and in the flag table (docs/flags.md)."""
    return field(default_factory=keys, metadata={"title": title})


@dataclass(frozen=True)
class Config:
    run: RunConfig = section(RunConfig, "Global")
    data: DataConfig = section(DataConfig, "Dataset and augmentation")
    model: ModelConfig = section(ModelConfig, "Model")
    lr: LRConfig = section(LRConfig, "Learning rate")
    optimizer: OptimizerConfig = section(OptimizerConfig, "Optimizer")
    loss: LossConfig = section(LossConfig, "Loss")
    finetune: FinetuneConfig = section(FinetuneConfig, "Fine-tuning")
    amp: AmpConfig = section(AmpConfig, "Mixed precision")
    asp: AspConfig = section(AspConfig, "Sparsity (ASP)")
    qat: QatConfig = section(QatConfig, "Quantization-aware training")
    check: CheckConfig = section(CheckConfig, "Data check")
    inference: InferenceConfig = section(InferenceConfig, "Paddle Inference")
    serve: ServeConfig = section(ServeConfig, "Serving")

    def to_dict(self):
        return dataclasses.asdict(self)

    def flat(self):
        """The {"section.key": value} mapping ``build_config`` takes: a Config to vary."""
        return {f"{s}.{k}": v for s, entries in self.to_dict().items() for k, v in entries.items()}

    @property
    def report_file(self):
        return self.run.report_file or os.path.join(self.run.output_dir, "report.json")


# Keys of the inference and serving sections: read by export_model.py, inference.py and
# paddle-resnet-serve, not part of a training run (a resume may change them).
INFERENCE_SECTIONS = ("inference", "serve")

_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}
SECTION_TITLES = {f.name: f.metadata["title"] for f in dataclasses.fields(Config)}


def config_field(dotted, source="config"):
    """The dataclass field of ``section.key``; ConfigError naming ``source`` if there is none."""
    section, _, name = dotted.partition(".")
    if section in _SECTIONS:
        for f in dataclasses.fields(_SECTIONS[section]):
            if f.name == name:
                return f
    raise ConfigError(f"{source}: unknown config key {dotted!r}")


def _bool(value):
    text = str(value).lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError("expects true or false")


def parse_bool(value, source):
    """``value`` ("True", "0", "yes", ...) as a bool; ConfigError naming ``source`` if it is none."""
    try:
        return _bool(value)
    except ValueError as err:
        raise ConfigError(f"{source} {value!r}: {err}") from None


def convert_value(dotted, value, source):
    """Coerce ``value`` to the type of config field ``dotted``; ConfigError if it cannot."""
    f = config_field(dotted)
    kind, args = typing.get_origin(f.type), typing.get_args(f.type)
    try:
        if value is None:
            if kind is typing.Union and type(None) in args:
                return None
            raise ValueError("a value is required")
        if kind is typing.Union:  # Optional[X]
            kind, args = None, ()
            target = next(a for a in typing.get_args(f.type) if a is not type(None))
        else:
            target = f.type
        if kind is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            items = tuple(args[0](v) for v in items if str(v).strip() != "")
            if Ellipsis not in args and len(items) != len(args):
                raise ValueError(f"expects {len(args)} comma-separated values")
            return items
        if target is bool:
            return _bool(value)
        if target is int and isinstance(value, float) and not value.is_integer():
            raise ValueError("expects a whole number")
        value = target(value)
        # NVIDIA's scripts write choices capitalised (--lr-scheduler Cosine)
        choices = f.metadata["choices"] or ()
        return next((c for c in choices if str(c).lower() == str(value).lower()), value)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {dotted}={value!r}: {err}") from None


def resolve_config_path(name_or_path):
    """A recipe is a YAML path or a name in configs/ (without .yaml)."""
    if os.path.isfile(name_or_path):
        return name_or_path
    candidate = os.path.join(CONFIG_DIR, name_or_path + ".yaml")
    if os.path.isfile(candidate):
        return candidate
    raise ConfigError(
        f"config {name_or_path!r} not found; recipes: {', '.join(list_recipes()) or 'none'}"
    )


def list_recipes():
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


# A recipe is a few hundred bytes of keys; a file a thousand times larger is something
# else, and PyYAML's parser would take a minute over 50 MB.
MAX_RECIPE_BYTES = 1 << 20


def read_recipe(path):
    text = read_text(path, ConfigError, limit=MAX_RECIPE_BYTES, what="recipe")
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be read as YAML") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    values = {}
    for section, entries in document.items():
        if section not in _SECTIONS:
            raise ConfigError(
                f"{path}: unknown config section {section!r}; known: {', '.join(_SECTIONS)}"
            )
        if not isinstance(entries, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping")
        for key, value in entries.items():
            dotted = f"{section}.{key}"
            config_field(dotted, path)
            values[dotted] = convert_value(dotted, value, path)
    return values


def build_config(values, source="config"):
    """A Config from a flat {"section.key": value} mapping, converted and validated."""
    for dotted in values:
        config_field(dotted, source)
    values = {dotted: convert_value(dotted, value, source) for dotted, value in values.items()}
    sections = {}
    for name, section_type in _SECTIONS.items():
        prefix = name + "."
        sections[name] = section_type(
            **{k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
        )
    config = Config(**sections)
    validate(config)
    return config


def all_keys():
    """("section.key", field) of every config key, in declaration order."""
    return [
        (f"{section}.{f.name}", f)
        for section, section_type in _SECTIONS.items()
        for f in dataclasses.fields(section_type)
    ]


def run_differences(saved, config):
    """The keys whose value in ``config`` differs from ``saved`` (another run's
    ``Config.to_dict()``, as a checkpoint records it), but for those a resumed run may
    change and the inference section; as "key: saved -> now" lines."""
    now = yaml.safe_load(to_yaml(config))  # tuples as lists, as JSON keeps them
    differences = []
    for dotted, f in all_keys():
        section, _, name = dotted.partition(".")
        if f.metadata["resume_may_change"] or section in INFERENCE_SECTIONS:
            continue
        # a key added since the saved run was written had its default then (as JSON keeps it)
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        before, after = saved.get(section, {}).get(name, default), now[section][name]
        if before != after:
            differences.append(f"{dotted}: {before!r} -> {after!r}")
    return differences


def describe_key(dotted):
    """``section.key (--flag)``, as errors name a key."""
    return f"{dotted} ({config_field(dotted).metadata['flag']})"


def _problem(f, value):
    choices, check = f.metadata["choices"], f.metadata["check"]
    if choices and value not in choices and value is not None:
        return f"must be one of {', '.join(map(str, choices))}, got {value!r}"
    return check(value) if check and value is not None else None


def validate(config):
    """Reject values that cannot work, naming the key and its flag."""
    for dotted, f in all_keys():
        section, _, name = dotted.partition(".")
        problem = _problem(f, getattr(getattr(config, section), name))
        if problem:
            raise ConfigError(f"{describe_key(dotted)} {problem}")
    d, run, loss = config.data, config.run, config.loss
    combinations = [
        (
            d.resize_short >= d.crop_size,
            f"data.resize_short (--resize-short) must be at least data.crop_size (--crop-size, "
            f"{d.crop_size}), got {d.resize_short}",
        ),
        (
            config.lr.warmup_epochs <= run.epochs,
            f"lr.warmup_epochs (--warmup-epochs) must be between 0 and run.epochs ({run.epochs}), "
            f"got {config.lr.warmup_epochs}",
        ),
        (not config.asp.prune_model or config.asp.enabled, "--prune-model needs --asp"),
        # NVIDIA's sparse INT8 order: prune and fine-tune with the masks, then train with
        # quantization from that 2:4 model, masks kept (QAT from freshly pruned weights
        # would learn scales of a model that has not recovered yet).
        (
            not (config.asp.prune_model and config.qat.enabled),
            "--prune-model with --qat: prune and fine-tune first (--asp --prune-model), then "
            "train with quantization from that 2:4 model (--asp --qat --from-pretrained-params "
            "<its model.pdparams>, or --from-checkpoint <its folder>)",
        ),
        (
            not (run.from_checkpoint and run.from_pretrained_params),
            "--from-checkpoint and --from-pretrained-params exclude each other",
        ),
        (
            loss.class_weights or loss.class_weights_from_epoch == 1,
            "--class-weights-from-epoch needs --class-weights (the weights it defers)",
        ),
        (
            loss.class_weights_from_epoch <= run.epochs,
            f"loss.class_weights_from_epoch (--class-weights-from-epoch) must be at most "
            f"run.epochs ({run.epochs}), got {loss.class_weights_from_epoch}: the weights "
            "would never apply",
        ),
        # Balanced draws already show every class equally often: weights or offsets from
        # the split's counts would correct the imbalance a second time.
        (
            d.sampling != "class-balanced" or not (loss.class_weights or loss.logit_adjustment),
            "--sampling class-balanced with --class-weights or --logit-adjustment corrects "
            "the imbalance twice: choose one",
        ),
    ]
    for holds, message in combinations:
        if not holds:
            raise ConfigError(message)


def to_yaml(config):
    def plain(value):
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return yaml.safe_dump(plain(config.to_dict()), sort_keys=False)
