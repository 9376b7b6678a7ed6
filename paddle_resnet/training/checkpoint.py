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

import paddle

from paddle_resnet.core.atomic import recover_staged, remove_directory, staged_directory
from paddle_resnet.core.errors import (
    CheckpointError,
    RestartableError,
    os_error_is_users,
    os_error_reason,
)

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
