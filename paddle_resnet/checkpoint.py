"""Checkpoints: written atomically, verified before they are read.

A checkpoint is a folder <output-dir>/<arch>/<epochs done>/ holding
``model.pdparams`` (parameters, BN statistics), ``model.pdopt`` (momentum,
loss scaling, ASP masks, learning-rate variable), ``model.pdmodel`` and
``meta.json`` (epoch, global step, config, classes, and the size and SHA-256 of
each file). The folder is assembled under a temporary name and renamed into
place (``staged_directory``), so a crash mid-save leaves the previous checkpoints
as they were.
"""
import hashlib
import json
import os
import pickle

import numpy as np
import paddle
from paddle.base.data_feeder import convert_dtype

from paddle_resnet.atomic import recover_staged, staged_directory
from paddle_resnet.config import run_differences
from paddle_resnet.errors import CheckpointError
from paddle_resnet.sparsity.pattern import MASK_SUFFIX

PREFIX = "model"
META = "meta.json"


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_dir(output_dir, arch, epoch):
    return os.path.join(output_dir, arch, str(epoch))


def save_checkpoint(program, directory, meta, prefix=PREFIX):
    """Write ``program``'s persistable variables (``<prefix>.pdparams`` ...) and ``meta`` to
    ``directory``, atomically. A full disk or an unwritable folder is a CheckpointError;
    earlier checkpoints stay."""
    meta = dict(meta, prefix=prefix)
    try:
        with staged_directory(directory) as staging:
            paddle.static.save(program, os.path.join(staging, prefix))
            files = {}
            for name in sorted(os.listdir(staging)):
                path = os.path.join(staging, name)
                files[name] = {"bytes": os.path.getsize(path), "sha256": _sha256(path)}
            with open(os.path.join(staging, META), "w") as handle:
                json.dump(dict(meta, files=files), handle, indent=1)
    except OSError as err:
        raise CheckpointError(f"{directory}: the checkpoint cannot be written "
                              f"({err.strerror or err}); the earlier checkpoints are intact") from None


def saved_epochs(folder):
    """The epochs of the complete checkpoints in an <output-dir>/<arch> folder."""
    if not os.path.isdir(folder):
        return []
    recover_staged(folder)
    return sorted(int(name) for name in os.listdir(folder)
                  if name.isdigit() and os.path.exists(os.path.join(folder, name, META)))


def check_same_run(meta, config, source):
    """CheckpointError unless ``config`` continues the run that wrote ``meta``."""
    differences = run_differences(meta.get("config", {}), config)
    if differences:
        raise CheckpointError(f"{source} belongs to another run: {'; '.join(differences[:4])}"
                              f"{' ...' if len(differences) > 4 else ''} (only where files go "
                              "and how often to log, save and validate may change on resume)")


def check_output_free(config, resuming_meta):
    """A training run writes <output-dir>/<arch>/<epoch>: refuse to mix its checkpoints
    with those of another run already there."""
    folder = os.path.join(config.run.output_dir, config.model.arch)
    epochs = saved_epochs(folder)
    if not epochs:
        return
    if resuming_meta is None:
        raise CheckpointError(f"{folder} already holds checkpoints of an earlier run (epochs "
                              f"{epochs[0]}-{epochs[-1]}): resume it with --from-checkpoint "
                              f"{folder}, or choose another --output-dir")
    newest = os.path.join(folder, str(epochs[-1]))
    with open(os.path.join(newest, META)) as handle:
        check_same_run(json.load(handle), config, newest)


def resolve_checkpoint(path):
    """A checkpoint folder, or an <output-dir>/<arch> folder (its newest checkpoint).
    Folder replacements that a crash interrupted are finished first (``recover_staged``)."""
    path = os.path.abspath(path)
    recover_staged(os.path.dirname(path))
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    if os.path.exists(os.path.join(path, META)):
        return path
    recover_staged(path)
    epochs = sorted(int(name) for name in os.listdir(path) if name.isdigit())
    if not epochs:
        raise CheckpointError(f"{path}: no {META}; not a checkpoint folder")
    newest = os.path.join(path, str(epochs[-1]))
    if not os.path.exists(os.path.join(newest, META)):
        raise CheckpointError(f"{newest}: the newest checkpoint folder has no {META} (damaged, "
                              "or not written by this toolkit); remove it or name an epoch "
                              "folder explicitly")
    return newest


def read_checkpoint(path):
    """(meta, state) of a verified checkpoint; state maps variable names to arrays."""
    directory, meta = verify_checkpoint(path)
    return meta, read_state(os.path.join(directory, meta.get("prefix", PREFIX)))


def verify_checkpoint(path):
    """(folder, meta) of a checkpoint whose files match their recorded sizes and SHA-256."""
    directory = resolve_checkpoint(path)
    meta_path = os.path.join(directory, META)
    try:
        with open(meta_path) as handle:
            meta = json.load(handle)
    except ValueError as err:
        raise CheckpointError(f"{meta_path}: unreadable ({err})") from None
    for name, expected in meta.get("files", {}).items():
        file_path = os.path.join(directory, name)
        if not os.path.exists(file_path):
            raise CheckpointError(f"{file_path}: missing from the checkpoint")
        if os.path.getsize(file_path) != expected["bytes"] or _sha256(file_path) != expected["sha256"]:
            raise CheckpointError(f"{file_path}: truncated or modified "
                                  f"(expected {expected['bytes']} bytes, sha256 {expected['sha256'][:12]}...)")
    return directory, meta


def read_state(prefix, optimizer=True):
    """Variable name -> array from ``<prefix>.pdparams``, and with ``optimizer`` also
    from ``<prefix>.pdopt`` if present (momentum, loss scaling, ASP masks)."""
    if prefix.endswith(".pdparams"):
        prefix = prefix[: -len(".pdparams")]
    if not os.path.exists(prefix + ".pdparams"):
        raise CheckpointError(f"{prefix}.pdparams does not exist")
    try:
        if optimizer:
            return dict(paddle.static.load_program_state(prefix))
        with open(prefix + ".pdparams", "rb") as handle:   # the format load_program_state reads
            return dict(pickle.load(handle, encoding="latin1"))
    except Exception as err:  # pickle and Paddle raise several types for broken files
        raise CheckpointError(f"{prefix}.pdparams: cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''})") from None


# Variables the quantization passes add (quantize_linear's scales and zero points).
QAT_SUFFIXES = ("@scale", "@zero_point")


def persistable_variables(program):
    return [v for v in program.list_vars() if v.persistable and v.name not in ("feed", "fetch")]


def restore_state(program, state):
    """Put every persistable variable of ``program`` back from ``state`` (strict)."""
    variables = persistable_variables(program)
    missing = [v.name for v in variables if v.name not in state]
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} variables of this program, "
                              f"e.g. {missing[:3]}; was it written by another configuration?")
    _assign(variables, state)


def load_pretrained(program, state, source, arch, may_skip=()):
    """Copy the parameters whose names and shapes match; return the ones skipped, each as
    "name (why)". ASP masks are left alone: pruning sets them.

    Only parameters named in ``may_skip`` (a new classifier) may be skipped: any other
    mismatch means ``source`` holds another architecture, a CheckpointError. Values are
    cast to the parameter's dtype (pure-fp16 checkpoints into fp32 programs).
    """
    chosen, skipped, unexpected = [], [], []
    for param in program.all_parameters():
        if param.name.endswith(MASK_SUFFIX):
            continue                    # ASP masks come from pruning, not from weights
        if param.name not in state:
            reason = "not in the file"
        elif tuple(state[param.name].shape) != tuple(param.shape):
            reason = f"shape {tuple(state[param.name].shape)} in the file, {tuple(param.shape)} here"
        else:
            chosen.append(param)
            continue
        skipped.append(f"{param.name} ({reason})")
        if param.name not in may_skip:
            unexpected.append(skipped[-1])
    if unexpected:
        raise CheckpointError(f"{source}: does not fit {arch}: {len(unexpected)} parameters "
                              f"do not match, e.g. {unexpected[0]}")
    # A QAT checkpoint's trained quantization scales, where the program has them too (an
    # eval program's own output scales, e.g. of its softmax, are not in a checkpoint).
    chosen += [v for v in persistable_variables(program)
               if v.name.endswith(QAT_SUFFIXES) and v.name in state]
    _assign(chosen, state, cast=True)
    return skipped


def _assign(variables, state, cast=False):
    scope = paddle.static.global_scope()
    place = paddle.framework._current_expected_place()
    for var in variables:
        tensor = scope.var(var.name).get_tensor()
        value = np.asarray(state[var.name])
        if cast:
            value = value.astype(convert_dtype(var.dtype), copy=False)
        if tuple(value.shape) != tuple(var.shape) and -1 not in var.shape:
            raise CheckpointError(f"{var.name}: shape {value.shape} in the checkpoint, "
                                  f"{tuple(var.shape)} in the program")
        tensor.set(value, place)
