"""Checkpoints: written atomically, verified before they are read.

A checkpoint is a folder <output-dir>/<arch>/<epochs done>/ (or, for a run stopped
in the middle of epoch E after K steps, <output-dir>/<arch>/<E>-step<K>/) holding
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
import re

import numpy as np
import paddle

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.atomic import recover_staged, remove_directory, staged_directory
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.training import ir
from paddle_resnet.training.qat import QAT_SUFFIXES, is_qat_variable
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX

PREFIX = "model"
META = "meta.json"
AUTO = "auto"  # --from-checkpoint auto: the newest checkpoint in <output-dir>/<arch>
_NAME = re.compile(r"^(?P<epoch>\d+)(?:-step(?P<step>\d+))?$")


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_dir(output_dir, arch, epoch):
    return os.path.join(output_dir, arch, str(epoch))


def checkpoint_name(epochs_done, steps_done):
    """The folder name of a checkpoint after ``epochs_done`` epochs and ``steps_done``
    steps of the next: "<epochs>" or "<epoch in progress>-step<steps>"."""
    return f"{epochs_done + 1}-step{steps_done}" if steps_done else str(epochs_done)


def progress_of(name):
    """(epochs done, steps done in the next) of a checkpoint folder name, else None."""
    match = _NAME.match(name)
    if not match:
        return None
    if match["step"] is None:
        return int(match["epoch"]), 0
    return int(match["epoch"]) - 1, int(match["step"])


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
        raise CheckpointError(
            f"{directory}: the checkpoint cannot be written "
            f"({err.strerror or err}); the earlier checkpoints are intact"
        ) from None


def saved_checkpoints(folder):
    """[(progress, path)] of the complete checkpoints (those with a meta.json) in an
    <output-dir>/<arch> folder, oldest first; progress as ``progress_of``. Folder
    replacements and removals that a crash interrupted are finished first."""
    if not os.path.isdir(folder):
        return []
    recover_staged(folder)
    found = []
    for name in os.listdir(folder):
        progress = progress_of(name)
        if progress and os.path.exists(os.path.join(folder, name, META)):
            found.append((progress, os.path.join(folder, name)))
    return sorted(found)


def newest_verified(folder, warn):
    """The newest checkpoint in ``folder`` whose files verify, or None; each newer one
    that does not (damaged outside the toolkit's atomic writes) is passed to ``warn``
    as one line and skipped, so a restarted job continues from the one before."""
    for _, path in reversed(saved_checkpoints(folder)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as err:
            warn(f"warning: {err}; skipped by --from-checkpoint auto")
    return None


def remove_superseded(folder, keep_epochs):
    """Retention (--keep-checkpoints N): remove the epoch checkpoints older than the
    newest ``keep_epochs`` and every mid-epoch checkpoint older than the newest
    checkpoint, which is never removed; returns the names removed. Each removal is
    crash-safe (``atomic.remove_directory``)."""
    saved = saved_checkpoints(folder)
    if not keep_epochs or not saved:
        return []
    kept_epochs = [path for (_, steps), path in saved if not steps][-keep_epochs:]
    removed = []
    for (_, steps), path in saved[:-1]:
        if steps or path not in kept_epochs:
            remove_directory(path)
            removed.append(os.path.basename(path))
    return removed


def resolve_checkpoint(path):
    """A checkpoint folder, or an <output-dir>/<arch> folder (its newest checkpoint, at
    an epoch's end or within one). Folder replacements that a crash interrupted are
    finished first (``recover_staged``)."""
    path = os.path.abspath(path)
    recover_staged(os.path.dirname(path))
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    if os.path.exists(os.path.join(path, META)):
        return path
    recover_staged(path)
    names = sorted((progress_of(name), name) for name in os.listdir(path) if progress_of(name))
    if not names:
        raise CheckpointError(f"{path}: no {META}; not a checkpoint folder")
    newest = os.path.join(path, names[-1][1])
    if not os.path.exists(os.path.join(newest, META)):
        raise CheckpointError(
            f"{newest}: the newest checkpoint folder has no {META} (damaged, "
            "or not written by this toolkit); remove it or name a checkpoint "
            "folder explicitly"
        )
    return newest


def classes_beside(weights_file):
    """The class names of the checkpoint whose weights file is ``weights_file`` (a
    checkpoint's model.pdparams given to --from-pretrained-params), else None."""
    meta_path = os.path.join(os.path.dirname(os.path.abspath(weights_file)), META)
    if not os.path.isfile(meta_path):
        return None
    try:
        with open(meta_path) as handle:
            return json.load(handle).get("classes")
    except (OSError, ValueError):
        return None


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
        if (
            os.path.getsize(file_path) != expected["bytes"]
            or _sha256(file_path) != expected["sha256"]
        ):
            raise CheckpointError(
                f"{file_path}: truncated or modified "
                f"(expected {expected['bytes']} bytes, sha256 {expected['sha256'][:12]}...)"
            )
    return directory, meta


def read_state(prefix, optimizer=True):
    """Variable name -> array from ``<prefix>.pdparams``, and with ``optimizer`` also
    from ``<prefix>.pdopt`` if present (momentum, loss scaling, ASP masks)."""
    if prefix.endswith(".pdparams"):
        prefix = prefix[: -len(".pdparams")]
    if not os.path.exists(prefix + ".pdparams"):
        raise CheckpointError(f"{prefix}.pdparams does not exist")
    if not optimizer:
        return read_pickle(prefix + ".pdparams")
    try:
        return dict(paddle.static.load_program_state(prefix))
    except Exception as err:  # pickle and Paddle raise several types for broken files
        raise CheckpointError(
            f"{prefix}.pdparams: cannot be read ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''})"
        ) from None


def read_pickle(path):
    """{name: value} of a Paddle parameter pickle (what ``paddle.save`` and
    ``load_program_state`` write and read), whatever the file is named."""
    try:
        with open(path, "rb") as handle:
            state = pickle.load(handle, encoding="latin1")
    except Exception as err:  # pickle raises several types for broken files
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if path.endswith(".pdparams"):
            raise CheckpointError(f"{path}: cannot be read (truncated or damaged? {why})") from None
        raise CheckpointError(
            f"{path}: not a weights file (neither PyTorch, safetensors nor a Paddle pickle: {why})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not named tensors")
    return state


def persistable_variables(program):
    return [v for v in program.list_vars() if v.persistable and v.name not in ("feed", "fetch")]


def restore_state(program, state):
    """Put every persistable variable of ``program`` back from ``state`` (strict)."""
    variables = persistable_variables(program)
    missing = [v.name for v in variables if v.name not in state]
    if missing:
        raise CheckpointError(
            f"checkpoint lacks {len(missing)} variables of this program, "
            f"e.g. {missing[:3]}; was it written by another configuration?"
        )
    _assign(variables, state)


def load_pretrained(program, state, source, arch, may_skip=(), masks=False):
    """Copy the parameters whose names and shapes match; return the ones skipped, each as
    "name (why)". ASP masks are copied with ``masks`` where the file has them; otherwise
    they are left alone (pruning sets them).

    QAT's quantizer parameters on PIR are copied where the file has them, like masks
    (an fp32 file starts QAT with fresh quantizers, as on the legacy IR).

    Only parameters named in ``may_skip`` (a new classifier) may be skipped: any other
    mismatch means ``source`` holds another architecture, a CheckpointError. Values are
    cast to the parameter's dtype (pure-fp16 checkpoints into fp32 programs).
    """
    chosen, skipped, unexpected = [], [], []
    for param in ir.parameters(program):
        if param.name.endswith(MASK_SUFFIX):
            if masks and param.name in state:
                chosen.append(param)
            continue  # otherwise ASP masks come from pruning
        if is_qat_variable(param.name):
            if param.name in state:
                chosen.append(param)
            continue
        if param.name not in state:
            reason = "not in the file"
        elif tuple(state[param.name].shape) != tuple(param.shape):
            reason = (
                f"shape {tuple(state[param.name].shape)} in the file, {tuple(param.shape)} here"
            )
        else:
            chosen.append(param)
            continue
        skipped.append(f"{param.name} ({reason})")
        if param.name not in may_skip:
            unexpected.append(skipped[-1])
    if unexpected:
        raise CheckpointError(
            f"{source}: does not fit {arch}: {len(unexpected)} parameters "
            f"do not match, e.g. {unexpected[0]}"
        )
    # A QAT checkpoint's trained quantization scales, where the program has them too (an
    # eval program's own output scales, e.g. of its softmax, are not in a checkpoint).
    chosen += [
        v
        for v in persistable_variables(program)
        if v.name.endswith(QAT_SUFFIXES) and v.name in state
    ]
    _assign(chosen, state, cast=True)
    # Pure fp16: the optimizer updates fp32 master copies and casts them back, so the
    # loaded weights must reach the masters too (they hold the random initialisation,
    # cast when the startup program ran, and the first step would bring it back).
    masters = master_weights(program)
    _assign(
        [program.global_block().var(masters[v.name]) for v in chosen if v.name in masters],
        {masters[name]: value for name, value in state.items() if name in masters},
        cast=True,
    )
    return skipped


def master_weights(program):
    """{parameter: its fp32 master copy} of a pure-fp16 train program (empty otherwise;
    pure fp16 is built on the legacy IR only)."""
    if paddle_internals.is_pir_program(program):
        return {}
    return {
        op.input("Param")[0]: op.input("MasterParam")[0]
        for op in program.global_block().ops
        if "MasterParam" in op.input_names and op.input("MasterParam")
    }


def _assign(variables, state, cast=False):
    scope = paddle.static.global_scope()
    place = paddle_internals.current_place()
    for var in variables:
        tensor = scope.var(var.name).get_tensor()
        value = np.asarray(state[var.name])
        if cast:
            value = value.astype(paddle_internals.numpy_dtype(var.dtype), copy=False)
        if tuple(value.shape) != tuple(var.shape) and -1 not in var.shape:
            raise CheckpointError(
                f"{var.name}: shape {value.shape} in the checkpoint, "
                f"{tuple(var.shape)} in the program"
            )
        tensor.set(value, place)
