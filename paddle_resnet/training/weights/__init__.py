"""Start weights: a checkpoint of this toolkit, or pretrained parameters (torchvision or
timm as PyTorch or safetensors files, PaddleClas ``.pdparams``): ``read_weights`` before
the programs are built, ``program_state``, then ``into_program.load_pretrained``.
"""

import os

from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.models import model_entry
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training.qat import is_qat_variable
from paddle_resnet.training.weights.files import read_tensors
from paddle_resnet.training.weights.naming import recognise


def read_weights(run_config):
    """(meta, state) from --from-checkpoint, (None, state) from --from-pretrained-params
    (keyed by the file's names: ``program_state``), or (None, None)."""
    if run_config.from_checkpoint == ckpt.AUTO:  # train.py resolves it (training.start)
        raise CheckpointError(
            "--from-checkpoint auto continues a training run in its --output-dir; "
            "name a checkpoint folder here"
        )
    if run_config.from_checkpoint:
        path = run_config.from_checkpoint
        if run_config.last_epoch_of_checkpoint not in (None, "auto"):  # NVIDIA's flag
            path = os.path.join(path, run_config.last_epoch_of_checkpoint)
        return ckpt.read_checkpoint(path)
    if run_config.from_pretrained_params:
        return None, read_tensors(pretrained_file(run_config))[1]
    return None, None


def pretrained_file(run_config):
    """--from-pretrained-params: a file, or (NVIDIA's form) a folder of it."""
    path = run_config.from_pretrained_params
    if os.path.isdir(path):
        return os.path.join(path, run_config.model_prefix + ".pdparams")
    return path


def program_state(state, meta, model, config, source):
    """(state keyed by ``model``'s variable names, a one-line note on what was read)."""
    structured = dict(model.state_dict())
    variable_names = {var.name for var in structured.values()}
    if variable_names & set(state):
        file_arch = _own_meta(meta, source).get("config", {}).get("model", {}).get("arch")
        if file_arch is not None:
            trained = model_entry(file_arch)
            variant = trained.family.variant(trained.spec)
            _check_variant(variant, f"trained as {file_arch}", config.model.arch, source)
        return state, f"{source}: this toolkit's parameters ({len(state)} tensors)"
    return _imported(state, structured, config, source)


def _own_meta(meta, source):
    """A file of this toolkit's meta.json (given, or beside the file), or {}."""
    if meta is None:
        sibling = os.path.join(os.path.dirname(os.path.abspath(source)), ckpt.META)
        if not os.path.exists(sibling):
            return {}
        meta = ckpt.read_meta(sibling)
    return meta


def check_quantization(meta, state, config, source):
    """Evaluation and export read weights as trained: a QAT model with --qat, any other
    without (else a QAT model was scored as fp32, 0.8200 instead of 0.8233, without a
    word)."""
    trained_qat = _own_meta(meta, source).get("config", {}).get("qat", {}).get("enabled") or any(
        is_qat_variable(name) for name in state
    )
    if trained_qat and not config.qat.enabled:
        raise CheckpointError(
            f"{source}: a quantization-aware (--qat) model: give --qat "
            "to evaluate or export it with its trained scales"
        )
    if config.qat.enabled and not trained_qat:
        raise CheckpointError(
            f"{source}: not a quantization-aware model (no --qat in "
            "its meta.json, no QAT scales): drop --qat, or quantize it "
            "with export_model.py --ptq-algo"
        )


def _check_variant(file_variant, what, arch_name, source):
    """Refuse a file of another variant (ResNet v1 into v1.5: same shapes, other math)."""
    entry = model_entry(arch_name)
    family = entry.family
    ours = family.variant(entry.spec)
    if ours is not None and file_variant not in (None, ours):
        raise CheckpointError(
            f"{source}: holds a {family.name} {file_variant} ({what}); {arch_name} is a "
            f"{family.name} {ours}: the shapes agree but the networks differ "
            f"({family.variant_difference})"
        )


def _imported(state, structured, config, source):
    arch_name = config.model.arch
    entry = model_entry(arch_name)
    classifier = entry.family.classifier_keys()  # a classifier may be new
    src, expected = recognise(state, structured, entry, source)
    what = f"{src.name} {entry.family.name}s are {src.variant}"
    _check_variant(src.variant, what, arch_name, source)
    misfit = f"{source}: a {src.name} file that does not fit {arch_name}"
    converted = {}
    for file_name, ours in expected.items():
        if file_name not in state:
            raise CheckpointError(f"{misfit}: it has no tensor {file_name!r}")
        value = state[file_name].T if ours in src.transposed else state[file_name]
        wanted = tuple(structured[ours].shape)
        if tuple(value.shape) != wanted and ours not in classifier:
            raise CheckpointError(
                f"{misfit}: {file_name} has shape {tuple(state[file_name].shape)}, "
                f"{arch_name} needs {wanted}"
            )
        converted[structured[ours].name] = value
    extra = [name for name in state if name not in expected and not name.endswith(src.ignored)]
    if extra:
        raise CheckpointError(
            f"{misfit}: tensor {extra[0]!r} has no place in it ({len(extra)} such)"
        )
    return (
        converted,
        f"{source}: {src.name} weights ({len(converted)} tensors); "
        + _normalization_note(src, config.data),
    )


def _normalization_note(src, data_config):
    expected = f"mean {list(src.mean)}, std {list(src.std)} on RGB in [0, 1]"
    if (tuple(data_config.normalize_mean), tuple(data_config.normalize_std)) == (src.mean, src.std):
        return f"its models expect {expected}, as this run normalises"
    return (
        f"warning: its models expect {expected}; this run uses mean "
        f"{list(data_config.normalize_mean)}, std {list(data_config.normalize_std)} "
        "(--normalize-mean / --normalize-std)"
    )
