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
import time

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
    as one line and skipped, so a restarted job continues from the one before. When every
    checkpoint is damaged, a CheckpointError says so and what to do (a fresh start would
    be refused: the folder holds the run's checkpoints)."""
    saved = saved_checkpoints(folder)
    damage = []
    for _, path in reversed(saved):
        try:
            _verified(path)
            return path
        except CheckpointError as err:
            warn(f"warning: {err}; skipped by --from-checkpoint auto")
            damage.append(str(err))
    if damage:
        raise CheckpointError(
            f"--from-checkpoint auto: every checkpoint in {folder} is damaged "
            f"({describe_saved(saved)}; the newest: {damage[0]}): restore one from a copy, "
            f"or move the folder aside (mv {folder} {folder}.damaged) to start afresh"
        )
    return None


# The checkpoint folders this process verified, each with the inode, size and mtime of its
# files: retention reads a checkpoint's files once per run, not at every save, and again
# once any file changed.
_VERIFIED = set()


def _verified(path):
    """``verify_checkpoint(path)``, at most once per process for unchanged files."""
    path = os.path.abspath(path)
    files = []
    for name in sorted(os.listdir(path)):
        stat = os.stat(os.path.join(path, name))
        files.append((name, stat.st_ino, stat.st_size, stat.st_mtime_ns))
    key = (path, tuple(files))
    if key not in _VERIFIED:
        verify_checkpoint(path)
        _VERIFIED.add(key)


def _intact(path):
    try:
        _verified(path)
    except CheckpointError:
        return False
    return True


def remove_superseded(written, keep_epochs, resumed_from):
    """Retention (--keep-checkpoints N) by verified progress, after ``written`` was saved:
    counting from it, keep the newest N epoch checkpoints whose files verify and remove
    the older ones and every mid-epoch checkpoint older than ``written``. Never removed:
    ``written`` itself (read back first: a save that does not verify removes nothing),
    the checkpoint at progress ``resumed_from`` (where this run started; a restart
    before ``written`` is complete still has it), and anything newer than ``written``. A
    damaged checkpoint is never counted among the N, so it never costs a good one.
    Returns the names removed; each removal is crash-safe (``atomic.remove_directory``)."""
    if not keep_epochs:
        return []
    try:
        _verified(written)
    except CheckpointError as err:
        raise RestartableError(
            f"{err}: the checkpoint just saved does not read back as written (an I/O fault "
            "of the file system?); no checkpoint was removed"
        ) from None
    progress = progress_of(os.path.basename(written))
    kept = 0 if progress[1] else 1
    removed = []
    for (epochs, steps), path in reversed(saved_checkpoints(os.path.dirname(written))):
        if (epochs, steps) >= progress or (epochs, steps) == tuple(resumed_from):
            continue
        if not steps and kept < keep_epochs:
            kept += _intact(path)
            continue
        remove_directory(path)
        removed.append(os.path.basename(path))
    return removed


def set_aside_newer(folder, progress):
    """A rewind: move the checkpoints in ``folder`` newer than ``progress`` (those of
    the branch a run abandons by resuming an older checkpoint) aside as
    ``<name>.rewound-<UTC time>``, a name neither --from-checkpoint auto nor retention
    takes; returns (old name, new name) pairs."""
    if not os.path.isdir(folder):
        return []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = []
    named = sorted((progress_of(name), name) for name in os.listdir(folder) if progress_of(name))
    for _, name in [found for found in named if found[0] > tuple(progress)]:
        aside, count = f"{name}.rewound-{stamp}", 1
        while os.path.exists(os.path.join(folder, aside)):
            count += 1
            aside = f"{name}.rewound-{stamp}-{count}"
        os.rename(os.path.join(folder, name), os.path.join(folder, aside))
        moved.append((name, aside))
    return moved


def describe_saved(saved):
    """ "epochs 1-5 and 6-step31" for a message that names a folder's checkpoints
    (``saved_checkpoints``)."""
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
