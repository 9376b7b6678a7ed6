"""Checkpoints: written atomically, verified before they are read.

A checkpoint is a folder <output-dir>/<arch>/<epochs done>/ (stopped in epoch E after K
steps: <E>-step<K>/) holding ``model.pdparams`` (parameters, BN statistics),
``model.pdopt`` (momentum, loss scaling, ASP masks, LR), ``model.pdmodel`` and
``meta.json`` (progress, config, classes, each file's size and SHA-256), assembled under
a temporary name and renamed into place (``staged_directory``).
"""

import hashlib
import json
import os
import re

import numpy as np
import paddle

from paddle_resnet.core import safe_pickle
from paddle_resnet.core.atomic import recover_staged, staged_directory
from paddle_resnet.core.errors import (
    CheckpointError,
    RestartableError,
    os_error_is_users,
    os_error_reason,
)
from paddle_resnet.core.text_files import read_json_object, require_keys

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


def checkpoint_name(epochs_done, steps_done):
    """ "<epochs>", or "<epoch in progress>-step<steps>" within an epoch."""
    return f"{epochs_done + 1}-step{steps_done}" if steps_done else str(epochs_done)


def progress_of(name):
    """(epochs done, steps done in the next) of a checkpoint folder name, else None."""
    match = _NAME.match(name)
    if not match:
        return None
    if match["step"] is None:
        return int(match["epoch"]), 0
    return int(match["epoch"]) - 1, int(match["step"])


def progress_names(folder):
    """[(progress, name)] of the checkpoint folder names in ``folder``, oldest first."""
    return sorted((progress_of(name), name) for name in os.listdir(folder) if progress_of(name))


def save_checkpoint(program, directory, meta, prefix=PREFIX):
    """Write ``program``'s persistables and ``meta`` to ``directory``, atomically."""
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
        if not os_error_is_users(err):  # an I/O error of the file system: restartable
            raise RestartableError(
                f"{directory}: the checkpoint cannot be written ({err.strerror or err}: an "
                "I/O error of the file system); the earlier checkpoints are intact"
            ) from None
        raise CheckpointError(
            f"{directory}: the checkpoint cannot be written ({os_error_reason(err)}); "
            "the earlier checkpoints are intact"
        ) from None


def saved_checkpoints(folder):
    """[(progress, path)] of the complete checkpoints in a run folder, oldest first
    (replacements and removals a crash interrupted finished first)."""
    if not os.path.isdir(folder):
        return []
    recover_staged(folder)
    paths = [(progress, os.path.join(folder, name)) for progress, name in progress_names(folder)]
    return [
        (progress, path) for progress, path in paths if os.path.exists(os.path.join(path, META))
    ]


def describe_saved(saved):
    """ "epochs 1-5 and 6-step31", of ``saved_checkpoints``."""
    epochs = [progress[0] for progress, _ in saved if not progress[1]]
    within = [os.path.basename(path) for progress, path in saved if progress[1]]
    parts = []
    if epochs:
        parts.append(
            f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}-{epochs[-1]}"
        )
    parts += within[-1:]
    return " and ".join(parts)


def resolve_checkpoint(path):
    """A checkpoint folder, or a run folder's newest checkpoint (interrupted replacements
    finished first)."""
    path = os.path.abspath(path)
    recover_staged(os.path.dirname(path))
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    if os.path.exists(os.path.join(path, META)):
        return path
    recover_staged(path)
    names = progress_names(path)
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
    """The class names of the checkpoint holding ``weights_file``, else None."""
    meta_path = os.path.join(os.path.dirname(os.path.abspath(weights_file)), META)
    if not os.path.isfile(meta_path):
        return None
    return read_meta(meta_path).get("classes")


# What resuming, evaluating and exporting a checkpoint read of its meta.json.
_META_KEYS = {"epoch": int, "classes": list, "config": dict}


def read_checkpoint(path):
    """(meta, state) of a verified checkpoint; state maps variable names to arrays."""
    directory, meta = verify_checkpoint(path)
    meta_path = os.path.join(directory, META)
    require_keys(meta, _META_KEYS, meta_path, CheckpointError, "a checkpoint's meta.json")
    return meta, read_state(os.path.join(directory, meta.get("prefix", PREFIX)))


def read_meta(meta_path):
    """A checkpoint's meta.json, or a CheckpointError where it is not what
    ``save_checkpoint`` writes."""
    meta = read_json_object(meta_path, CheckpointError, "a checkpoint's meta.json")
    files = meta.get("files", {})
    listed = isinstance(files, dict) and all(
        isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("sha256"), str)
        for entry in files.values()
    )
    prefix = meta.get("prefix", PREFIX)
    if not listed or not isinstance(prefix, str) or os.path.basename(prefix) != prefix:
        raise CheckpointError(
            f"{meta_path}: damaged: not the files' sizes and SHA-256 and their prefix that "
            "this toolkit writes"
        )
    return meta


def verify_checkpoint(path):
    """(folder, meta) of a checkpoint whose files match their sizes and SHA-256."""
    directory = resolve_checkpoint(path)
    meta = read_meta(os.path.join(directory, META))
    for name, expected in meta.get("files", {}).items():
        file_path = os.path.join(directory, name)
        if not os.path.exists(file_path):
            raise CheckpointError(f"{file_path}: missing from the checkpoint")
        size, digest = expected["bytes"], expected["sha256"]
        if os.path.getsize(file_path) != size or _sha256(file_path) != digest:
            raise CheckpointError(
                f"{file_path}: truncated or modified "
                f"(expected {size} bytes, sha256 {digest[:12]}...)"
            )
    return directory, meta


def read_state(prefix, optimizer=True):
    """Variable name -> array from ``<prefix>.pdparams``, and with ``optimizer`` from
    ``<prefix>.pdopt`` where present (``read_pickle``)."""
    prefix = prefix.removesuffix(".pdparams")
    if not os.path.exists(prefix + ".pdparams"):
        raise CheckpointError(f"{prefix}.pdparams does not exist")
    state = read_pickle(prefix + ".pdparams")
    if optimizer and os.path.exists(prefix + ".pdopt"):
        state.update(read_pickle(prefix + ".pdopt"))
    return state


def read_pickle(path):
    """{name: value} of a Paddle parameter pickle, read by ``safe_pickle.load`` (which
    runs no code of the file) and refused where a tensor is not finite."""
    try:
        with open(path, "rb") as handle:
            state = safe_pickle.load(handle)
    except safe_pickle.RefusedGlobal as err:
        raise CheckpointError(
            f"{path}: refused: its pickle asks for {err.name}, which parameters never need "
            "(loading it could run code); only arrays, numbers and strings are read"
        ) from None
    except safe_pickle.Refused as err:
        raise CheckpointError(
            f"{path}: refused: its pickle {err.reason}; only arrays of numbers, numbers and "
            "strings are read"
        ) from None
    except OSError:
        raise  # a path, or an I/O error of the file system: errors.describe names it
    except Exception as err:  # pickle raises several types for broken files
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if path.endswith((".pdparams", ".pdopt")):
            raise CheckpointError(f"{path}: cannot be read (truncated or damaged? {why})") from None
        raise CheckpointError(
            f"{path}: not a weights file (neither PyTorch, safetensors nor a Paddle pickle: {why})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not named tensors")
    return check_finite({name: _array_of(value) for name, value in state.items()}, path)


def _array_of(value):
    """The array of a Tensor as ``paddle.save`` pickles it outside a state dict."""
    pair = isinstance(value, tuple) and len(value) == 2
    if pair and isinstance(value[0], str) and isinstance(value[1], np.ndarray):
        return value[1]
    return value


def check_finite(tensors, path):
    """``tensors``, or a CheckpointError naming the first array holding nan or inf."""
    for name, value in tensors.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc":
            finite = np.isfinite(value)
            if not finite.all():
                raise CheckpointError(
                    f"{path}: tensor {name!r} holds {value.size - np.count_nonzero(finite)} "
                    f"nan or inf values (of {value.size}): weights that are not finite give "
                    "nan outputs; the run that wrote them diverged"
                )
    return tensors
