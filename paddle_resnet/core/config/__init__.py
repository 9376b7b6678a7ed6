"""The one configuration object: defaults < YAML recipe < --set < command-line flags.

Each key is declared once, as a field of a frozen section dataclass made by ``keys.key``
(one module per group of sections); the validation here, each tool's command line and the
flag table (``core/cli.py``) are generated from those fields. ``build_config`` makes the
Config once; builders then take the section they need (``build_model(config.model)``).
"""

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field

import yaml

from paddle_resnet.core.bootstrap import FALSE_WORDS, TRUE_WORDS
from paddle_resnet.core.config.data import CheckConfig, DataConfig
from paddle_resnet.core.config.deploy import InferenceConfig, ServeConfig
from paddle_resnet.core.config.keys import CONFIG_DIR
from paddle_resnet.core.config.learning import FinetuneConfig, LossConfig, LRConfig, OptimizerConfig
from paddle_resnet.core.config.model import ModelConfig
from paddle_resnet.core.config.precision import AmpConfig, AspConfig, QatConfig
from paddle_resnet.core.config.run import RunConfig
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.core.text_files import read_text


def section(keys, title):
    """A section of the Config: its keys' dataclass, and the title heading its flags."""
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
# the field of each key by its "section.key", in declaration order
_FIELDS = {f"{s}.{f.name}": f for s, keys in _SECTIONS.items() for f in dataclasses.fields(keys)}


def config_field(dotted, source="config"):
    """The dataclass field of ``section.key``; ConfigError naming ``source`` if there is none."""
    if dotted not in _FIELDS:
        raise ConfigError(f"{source}: unknown config key {dotted!r}")
    return _FIELDS[dotted]


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
    f = config_field(dotted, source)
    kind, args = typing.get_origin(f.type), typing.get_args(f.type)
    try:
        if value is None:
            if kind is typing.Union and type(None) in args:
                return None
            raise ValueError("a value is required")
        target = f.type
        if kind is typing.Union:  # Optional[X]
            target = next(a for a in args if a is not type(None))
            kind, args = None, ()
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
            values[f"{section}.{key}"] = convert_value(f"{section}.{key}", value, path)
    return values


def build_config(values, source="config"):
    """A Config from a flat {"section.key": value} mapping, converted and validated."""
    for dotted in values:
        config_field(dotted, source)
    sections = {name: {} for name in _SECTIONS}
    for dotted, value in values.items():
        section, _, name = dotted.partition(".")
        sections[section][name] = convert_value(dotted, value, source)
    config = Config(**{name: _SECTIONS[name](**keys) for name, keys in sections.items()})
    validate(config)
    return config


def all_keys():
    """("section.key", field) of every config key, in declaration order."""
    return list(_FIELDS.items())


def run_differences(saved, config):
    """The "key: saved -> now" lines of the keys a resumed run may not change whose value
    in ``config`` differs from ``saved`` (a checkpoint's ``Config.to_dict()``)."""
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


def _problem(f, value):
    choices, check = f.metadata["choices"], f.metadata["check"]
    numbers = value if isinstance(value, tuple) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        # no key means anything by inf or nan (an inf --logit-adjustment made the loss nan)
        return f"must be a finite number, got {value!r}"
    if choices and value not in choices and value is not None:
        return f"must be one of {', '.join(map(str, choices))}, got {value!r}"
    return check(value) if check and value is not None else None


def validate(config):
    """Reject values that cannot work, naming the key and its flag."""
    for dotted, f in all_keys():
        section, _, name = dotted.partition(".")
        problem = _problem(f, getattr(getattr(config, section), name))
        if problem:
            raise ConfigError(f"{dotted} ({f.metadata['flag']}) {problem}")
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
            "loss.class_weights_from_epoch (--class-weights-from-epoch) must be at most run.epochs "
            f"({run.epochs}), got {loss.class_weights_from_epoch}: the weights would never apply",
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
