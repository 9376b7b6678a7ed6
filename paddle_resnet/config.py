"""The one configuration object: defaults < YAML recipe < command-line flags.

``load_config(argv)`` builds it once; every section is a frozen dataclass, so
nothing downstream can change it. Builders take the section they need
(``build_model(config.model)``, ``build_optimizer(config.optimizer, ...)``).
"""
import argparse
import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Optional, Tuple

import yaml

from paddle_resnet.errors import ConfigError

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
RUN_SCOPES = ("train_eval", "train_only", "eval_only")
LR_SCHEDULES = ("cosine", "step")
MASK_ALGOS = ("mask_1d", "mask_2d_greedy", "mask_2d_best")
DATA_FORMATS = ("folder", "recordio", "tfrecord")
BACKENDS = ("auto", "trt", "gpu", "cpu")
INFERENCE_MODES = ("accuracy", "benchmark", "predict")
TRT_PRECISIONS = ("FP32", "FP16", "INT8")
CPU_PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "resnet50"
    num_classes: int = 1000
    data_layout: str = "NCHW"
    zero_init_residual: bool = False


@dataclass(frozen=True)
class DataConfig:
    image_root: Optional[str] = None
    format: str = "folder"           # folder | recordio | tfrecord (scripts/data/make_records.py)
    batch_size: int = 256            # per device; eval uses the same
    crop_size: int = 224
    resize_short: int = 256
    rand_crop_scale: Tuple[float, float] = (0.08, 1.0)
    rand_crop_ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    normalize_mean: Tuple[float, float, float] = (0.485, 0.456, 0.406)
    normalize_std: Tuple[float, float, float] = (0.229, 0.224, 0.225)
    color_jitter: Tuple[float, float, float] = (0.0, 0.0, 0.0)   # brightness, contrast, saturation
    num_threads: int = 0             # DALI worker threads; 0 = all cores
    seed: int = 42                   # DALI shuffling and augmentation


@dataclass(frozen=True)
class LRConfig:
    base: float = 0.256              # for `reference_batch` images; scaled to the global batch
    reference_batch: int = 256
    schedule: str = "cosine"
    warmup_epochs: float = 5.0
    warmup_start_lr: float = 0.0
    milestones: Tuple[int, ...] = (30, 60, 80)   # `step` schedule only
    decay_factor: float = 0.1                    # `step` schedule only


@dataclass(frozen=True)
class OptimizerConfig:
    momentum: float = 0.875
    nesterov: bool = False
    weight_decay: float = 3.0517578125e-05      # 1/32768
    bn_weight_decay: bool = False                # also decay BN scale/shift and biases


@dataclass(frozen=True)
class LossConfig:
    label_smoothing: float = 0.1
    mixup_alpha: float = 0.0                     # 0: no MixUp


@dataclass(frozen=True)
class AmpConfig:
    enabled: bool = False
    scale_loss: float = 1.0
    use_dynamic_loss_scaling: bool = False
    use_pure_fp16: bool = False


@dataclass(frozen=True)
class AspConfig:
    enabled: bool = False
    prune_model: bool = False
    mask_algo: str = "mask_1d"
    exclude: Tuple[str, ...] = ("fc",)           # layers kept dense (paths as in the model)


@dataclass(frozen=True)
class RunConfig:
    epochs: int = 90
    run_scope: str = "train_eval"
    output_dir: str = "./output"
    eval_interval: int = 1
    save_interval: int = 1
    print_interval: int = 10
    report_file: Optional[str] = None            # default: <output_dir>/report.json
    benchmark: bool = False
    benchmark_steps: int = 100
    benchmark_warmup_steps: int = 100
    from_checkpoint: Optional[str] = None
    from_pretrained_params: Optional[str] = None
    seed: int = 42                               # parameter initialisation


@dataclass(frozen=True)
class InferenceConfig:
    model_dir: str = "./inference"               # export_model.py writes, inference.py reads
    backend: str = "auto"                        # auto | trt | gpu | cpu
    mode: str = "benchmark"                      # accuracy | benchmark | predict
    images: Tuple[str, ...] = ()                 # predict: image files or folders
    batch_sizes: Tuple[int, ...] = (1, 32)       # benchmark: one run per batch size
    trt_precision: str = "FP32"
    trt_workspace_size: int = 1024               # MB
    trt_min_subgraph_size: int = 3
    trt_use_static: bool = False
    trt_use_calib_mode: bool = False
    trt_use_synthetic: bool = False
    cpu_precision: str = "fp32"
    cpu_threads: int = 0                         # 0 = all cores
    log_path: str = "./inference.json"
    export_log_path: str = "./export.json"


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lr: LRConfig = field(default_factory=LRConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    asp: AspConfig = field(default_factory=AspConfig)
    run: RunConfig = field(default_factory=RunConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)

    def to_dict(self):
        return dataclasses.asdict(self)

    @property
    def report_file(self):
        return self.run.report_file or os.path.join(self.run.output_dir, "report.json")


# (flag, "section.key", help). The flag names follow NVIDIA's Paddle RN50v1.5
# example so its launch scripts carry over; the type comes from the dataclass.
FLAGS = {
    "Global": [
        ("--output-dir", "run.output_dir", "folder for checkpoints, reports and the class index"),
        ("--run-scope", "run.run_scope", "what to run: " + " | ".join(RUN_SCOPES)),
        ("--epochs", "run.epochs", "number of training epochs"),
        ("--save-interval", "run.save_interval", "save a checkpoint every N epochs"),
        ("--eval-interval", "run.eval_interval", "validate every N epochs (and after the last)"),
        ("--print-interval", "run.print_interval", "log every N steps"),
        ("--report-file", "run.report_file", "JSON-lines report (default <output-dir>/report.json)"),
        ("--benchmark", "run.benchmark", "measure throughput only: warm-up steps, then timed steps"),
        ("--benchmark-steps", "run.benchmark_steps", "timed steps in benchmark mode"),
        ("--benchmark-warmup-steps", "run.benchmark_warmup_steps", "untimed steps in benchmark mode"),
        ("--from-checkpoint", "run.from_checkpoint",
         "checkpoint folder (<output-dir>/<arch>/<epoch>) to resume from, at the next epoch"),
        ("--from-pretrained-params", "run.from_pretrained_params",
         "parameters to start from (a .pdparams file or its prefix); mismatched shapes are skipped"),
        ("--seed", "run.seed", "random seed of parameter initialisation"),
    ],
    "Dataset": [
        ("--image-root", "data.image_root", "folder holding train/<class>/*.jpg and val/<class>/*.jpg "
         "(or the record files, with --data-format)"),
        ("--data-format", "data.format", "input format: " + " | ".join(DATA_FORMATS)),
        ("--batch-size", "data.batch_size", "images per device per step (training and evaluation)"),
        ("--dali-random-seed", "data.seed", "seed of DALI shuffling and augmentation"),
        ("--dali-num-threads", "data.num_threads", "DALI threads per process (0: all cores)"),
    ],
    "Data Augmentation": [
        ("--crop-size", "data.crop_size", "side of the square network input"),
        ("--resize-short", "data.resize_short", "validation: shorter side before the centre crop"),
        ("--rand-crop-scale", "data.rand_crop_scale", "training crop area range, e.g. 0.08,1"),
        ("--rand-crop-ratio", "data.rand_crop_ratio", "training crop aspect-ratio range, e.g. 0.75,1.333"),
        ("--color-jitter", "data.color_jitter",
         "training ColorJitter strengths: brightness,contrast,saturation (e.g. 0.4,0.4,0.4)"),
        ("--normalize-mean", "data.normalize_mean", "per-channel mean (0-1 scale)"),
        ("--normalize-std", "data.normalize_std", "per-channel std (0-1 scale)"),
    ],
    "Model": [
        ("--model-arch-name", "model.arch", "registered architecture, e.g. resnet50, resnext101_32x4d"),
        ("--num-of-class", "model.num_classes", "number of classes (must match the data)"),
        ("--data-layout", "model.data_layout", "NCHW or NHWC"),
        ("--zero-init-residual", "model.zero_init_residual", "zero gamma in each block's last BN"),
    ],
    "Training": [
        ("--lr", "lr.base", "learning rate for --lr-reference-batch images; scaled to the global batch"),
        ("--lr-reference-batch", "lr.reference_batch", "global batch that --lr refers to"),
        ("--lr-scheduler", "lr.schedule", "after warm-up: " + " | ".join(LR_SCHEDULES)),
        ("--warmup-epochs", "lr.warmup_epochs", "linear warm-up epochs"),
        ("--warmup-start-lr", "lr.warmup_start_lr", "learning rate at step 0"),
        ("--lr-milestones", "lr.milestones", "step schedule: epochs where the LR drops, e.g. 30,60,80"),
        ("--lr-decay-factor", "lr.decay_factor", "step schedule: factor at each milestone"),
        ("--momentum", "optimizer.momentum", "SGD momentum"),
        ("--nesterov", "optimizer.nesterov", "Nesterov momentum"),
        ("--weight-decay", "optimizer.weight_decay", "L2 weight decay of conv and FC weights"),
        ("--bn-weight-decay", "optimizer.bn_weight_decay", "also decay BN scale/shift and biases"),
        ("--label-smoothing", "loss.label_smoothing", "label smoothing epsilon"),
        ("--mixup-alpha", "loss.mixup_alpha", "MixUp Beta(alpha, alpha); 0 disables it"),
    ],
    "Advanced Training": [
        ("--amp", "amp.enabled", "automatic mixed precision (Fleet strategy.amp)"),
        ("--scale-loss", "amp.scale_loss", "initial loss scaling"),
        ("--use-dynamic-loss-scaling", "amp.use_dynamic_loss_scaling", "dynamic loss scaling"),
        ("--use-pure-fp16", "amp.use_pure_fp16", "pure fp16 (O2) instead of mixed (O1)"),
        ("--asp", "asp.enabled", "automatic 2:4 sparsity (Fleet strategy.asp)"),
        ("--prune-model", "asp.prune_model", "prune the weights to 2:4 before training (needs --asp)"),
        ("--mask-algo", "asp.mask_algo", "mask algorithm: " + " | ".join(MASK_ALGOS)),
        ("--asp-exclude", "asp.exclude",
         "layers kept dense, comma-separated model paths (e.g. fc,layer4.2.conv3) or parameter names"),
    ],
}

INFERENCE_FLAGS = {
    "Paddle Inference": [
        ("--trt-inference-dir", "inference.model_dir", "inference model folder (written by export_model.py)"),
        ("--backend", "inference.backend", "predictor backend: " + " | ".join(BACKENDS)
         + " (auto: trt on GPUs, cpu otherwise)"),
        ("--mode", "inference.mode", "inference.py: " + " | ".join(INFERENCE_MODES)),
        ("--images", "inference.images", "predict: comma-separated image files or folders"),
        ("--benchmark-batch-sizes", "inference.batch_sizes", "benchmark: comma-separated batch sizes"),
        ("--trt-precision", "inference.trt_precision", "TensorRT precision: " + " | ".join(TRT_PRECISIONS)),
        ("--trt-workspace-size", "inference.trt_workspace_size", "TensorRT workspace in MB"),
        ("--trt-min-subgraph-size", "inference.trt_min_subgraph_size",
         "smallest subgraph handed to TensorRT"),
        ("--trt-use-static", "inference.trt_use_static", "serialize TensorRT engines for reuse"),
        ("--trt-use-calib-mode", "inference.trt_use_calib_mode",
         "INT8: calibrate on validation images (post-training quantization)"),
        ("--trt-use-synthat", "inference.trt_use_synthetic", "benchmark on synthetic input"),
        ("--cpu-precision", "inference.cpu_precision", "oneDNN precision: " + " | ".join(CPU_PRECISIONS)),
        ("--cpu-threads", "inference.cpu_threads", "CPU math threads (0: all cores)"),
        ("--trt-log-path", "inference.log_path", "JSON-lines inference report"),
        ("--trt-export-log-path", "inference.export_log_path", "JSON export report"),
    ],
}

_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _field(dotted, source="config"):
    """The dataclass field of ``section.key``; ConfigError naming ``source`` if there is none."""
    section, _, key = dotted.partition(".")
    if section in _SECTIONS:
        for f in dataclasses.fields(_SECTIONS[section]):
            if f.name == key:
                return f
    raise ConfigError(f"{source}: unknown config key {dotted!r}")


def _convert(dotted, value, source):
    """Coerce ``value`` to the type of config field ``dotted``; ConfigError if it cannot."""
    f = _field(dotted)
    kind, args = typing.get_origin(f.type), typing.get_args(f.type)
    try:
        if value is None:
            if kind is typing.Union and type(None) in args:
                return None
            raise ValueError("a value is required")
        if kind is typing.Union:            # Optional[X]
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
            text = str(value).lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError("expects true or false")
        if target is int and isinstance(value, float) and not value.is_integer():
            raise ValueError("expects a whole number")
        return target(value)
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


def _read_yaml(path):
    try:
        with open(path) as handle:
            document = yaml.safe_load(handle) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    values = {}
    for section, entries in document.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{path}: unknown config section {section!r}; "
                              f"known: {', '.join(_SECTIONS)}")
        if not isinstance(entries, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping")
        for key, value in entries.items():
            dotted = f"{section}.{key}"
            _field(dotted, path)
            values[dotted] = _convert(dotted, value, path)
    return values


def build_config(values, source="config"):
    """A Config from a flat {"section.key": value} mapping, converted and validated."""
    for dotted in values:
        _field(dotted, source)
    values = {dotted: _convert(dotted, value, source) for dotted, value in values.items()}
    sections = {}
    for name, section_type in _SECTIONS.items():
        prefix = name + "."
        sections[name] = section_type(**{k[len(prefix):]: v for k, v in values.items()
                                         if k.startswith(prefix)})
    config = Config(**sections)
    validate(config)
    return config


def _check(condition, message):
    if not condition:
        raise ConfigError(message)


def validate(config):
    """Reject values that cannot work, naming the key."""
    m, d, lr, o, run = config.model, config.data, config.lr, config.optimizer, config.run
    _check(run.epochs >= 1, f"run.epochs must be at least 1, got {run.epochs}")
    _check(m.num_classes >= 2, f"model.num_classes must be at least 2, got {m.num_classes}")
    _check(m.data_layout in ("NCHW", "NHWC"), f"model.data_layout must be NCHW or NHWC, got {m.data_layout!r}")
    _check(d.format in DATA_FORMATS, f"data.format must be one of {DATA_FORMATS}, got {d.format!r}")
    _check(d.batch_size >= 1, f"data.batch_size must be at least 1, got {d.batch_size}")
    _check(d.crop_size >= 8, f"data.crop_size must be at least 8, got {d.crop_size}")
    _check(d.resize_short >= d.crop_size,
           f"data.resize_short ({d.resize_short}) must be at least data.crop_size ({d.crop_size})")
    low, high = d.rand_crop_scale
    _check(0 < low <= high <= 1, f"data.rand_crop_scale must satisfy 0 < min <= max <= 1, got {low},{high}")
    low, high = d.rand_crop_ratio
    _check(0 < low <= high, f"data.rand_crop_ratio must satisfy 0 < min <= max, got {low},{high}")
    _check(all(s > 0 for s in d.normalize_std), "data.normalize_std must be positive")
    _check(all(0 <= j < 1 for j in d.color_jitter),
           f"data.color_jitter strengths must be in [0, 1), got {d.color_jitter}")
    _check(config.loss.mixup_alpha >= 0, f"loss.mixup_alpha must be >= 0, got {config.loss.mixup_alpha}")
    _check(d.num_threads >= 0, f"data.num_threads must be >= 0, got {d.num_threads}")
    _check(lr.base > 0, f"lr.base (--lr) must be positive, got {lr.base}")
    _check(lr.reference_batch >= 1, f"lr.reference_batch must be at least 1, got {lr.reference_batch}")
    _check(lr.schedule in LR_SCHEDULES, f"lr.schedule must be one of {LR_SCHEDULES}, got {lr.schedule!r}")
    _check(0 <= lr.warmup_epochs <= run.epochs,
           f"lr.warmup_epochs (--warmup-epochs) must be between 0 and run.epochs ({run.epochs}), "
           f"got {lr.warmup_epochs}")
    _check(lr.warmup_start_lr >= 0, f"lr.warmup_start_lr must be >= 0, got {lr.warmup_start_lr}")
    _check(list(lr.milestones) == sorted(lr.milestones) and all(e > 0 for e in lr.milestones),
           f"lr.milestones must be increasing positive epochs, got {lr.milestones}")
    _check(0 < lr.decay_factor <= 1, f"lr.decay_factor must be in (0, 1], got {lr.decay_factor}")
    _check(0 <= o.momentum < 1, f"optimizer.momentum must be in [0, 1), got {o.momentum}")
    _check(o.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, got {o.weight_decay}")
    _check(0 <= config.loss.label_smoothing < 1,
           f"loss.label_smoothing must be in [0, 1), got {config.loss.label_smoothing}")
    _check(config.amp.scale_loss > 0, f"amp.scale_loss must be positive, got {config.amp.scale_loss}")
    _check(config.asp.mask_algo in MASK_ALGOS,
           f"asp.mask_algo must be one of {MASK_ALGOS}, got {config.asp.mask_algo!r}")
    _check(not config.asp.prune_model or config.asp.enabled, "--prune-model needs --asp")
    _check(run.run_scope in RUN_SCOPES, f"run.run_scope must be one of {RUN_SCOPES}, got {run.run_scope!r}")
    for key in ("eval_interval", "save_interval", "print_interval", "benchmark_steps"):
        _check(getattr(run, key) >= 1, f"run.{key} must be at least 1, got {getattr(run, key)}")
    _check(run.benchmark_warmup_steps >= 0, "run.benchmark_warmup_steps must be >= 0")
    _check(not (run.from_checkpoint and run.from_pretrained_params),
           "--from-checkpoint and --from-pretrained-params exclude each other")
    inf = config.inference
    _check(inf.backend in BACKENDS, f"inference.backend must be one of {BACKENDS}, got {inf.backend!r}")
    _check(inf.mode in INFERENCE_MODES,
           f"inference.mode must be one of {INFERENCE_MODES}, got {inf.mode!r}")
    _check(inf.trt_precision in TRT_PRECISIONS,
           f"inference.trt_precision must be one of {TRT_PRECISIONS}, got {inf.trt_precision!r}")
    _check(inf.cpu_precision in CPU_PRECISIONS,
           f"inference.cpu_precision must be one of {CPU_PRECISIONS}, got {inf.cpu_precision!r}")
    _check(inf.batch_sizes and all(b >= 1 for b in inf.batch_sizes),
           f"inference.batch_sizes must be at least 1, got {inf.batch_sizes}")
    _check(inf.trt_workspace_size >= 1, "inference.trt_workspace_size must be at least 1 MB")
    _check(inf.trt_min_subgraph_size >= 1, "inference.trt_min_subgraph_size must be at least 1")
    _check(inf.cpu_threads >= 0, "inference.cpu_threads must be >= 0")


def build_parser(description, inference=False):
    """The command-line parser: every flag maps to one config key."""
    parser = argparse.ArgumentParser(description=description, argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", help="YAML recipe: a path or a name in configs/ "
                                         "(see --list-configs)")
    parser.add_argument("--list-configs", action="store_true", help="list the recipes and exit")
    parser.add_argument("--show-config", action="store_true",
                        help="print the resolved configuration as YAML and exit")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="set any config key, e.g. --set data.num_threads=2 (repeatable)")
    groups = dict(FLAGS, **INFERENCE_FLAGS) if inference else FLAGS
    for group_name, flags in groups.items():
        group = parser.add_argument_group(group_name)
        for flag, dotted, help_text in flags:
            field_ = _field(dotted)
            text = f"{help_text} [{dotted}, default {field_.default}]"
            if field_.type is bool:
                group.add_argument(flag, dest=dotted, action=argparse.BooleanOptionalAction,
                                   help=text)
            else:
                group.add_argument(flag, dest=dotted, metavar=dotted.split(".")[1].upper(),
                                   help=text)
    return parser


def config_from_args(namespace):
    """Defaults < recipe < --set < flags, as a validated Config."""
    given = vars(namespace)
    values = {}
    if given.get("config"):
        values.update(_read_yaml(resolve_config_path(given["config"])))
    for assignment in given.get("set") or []:
        dotted, sep, raw = assignment.partition("=")
        if not sep:
            raise ConfigError(f"--set {assignment!r}: expected SECTION.KEY=VALUE")
        _field(dotted, "--set")
        values[dotted] = _convert(dotted, yaml.safe_load(raw) if raw else None, "--set")
    for dotted, raw in given.items():
        if "." in dotted:
            values[dotted] = _convert(dotted, raw, "flag")
    return build_config(values)


def to_yaml(config):
    def plain(value):
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return yaml.safe_dump(plain(config.to_dict()), sort_keys=False)
