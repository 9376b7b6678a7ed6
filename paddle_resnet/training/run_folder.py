"""Which run an output folder belongs to: one run at a time (rank 0's lock), a
checkpoint resumed only by the run that wrote it, and no fresh run mixing its
checkpoints with another's. ``checkpoint.py`` is the format these checks read."""

import contextlib
import os

from paddle_resnet.core.atomic import check_writable_folder, run_lock
from paddle_resnet.core.config import run_differences
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.training import checkpoint as ckpt


@contextlib.contextmanager
def claimed(output_dir, rank):
    """While entered, the run owns ``output_dir``: rank 0 checks it can write there and
    holds its lock from before the run's checks to its last line; the other ranks
    follow rank 0 or end with it."""
    if rank != 0:
        yield
        return
    check_writable_folder(output_dir, "--output-dir")
    with run_lock(output_dir, f"--output-dir {output_dir}"):
        yield


def check_same_run(meta, config, source):
    """CheckpointError unless ``config`` continues the run that wrote ``meta``."""
    differences = run_differences(meta.get("config", {}), config)
    if differences:
        raise CheckpointError(
            f"{source} belongs to another run: {'; '.join(differences[:4])}"
            f"{' ...' if len(differences) > 4 else ''} (only where files go "
            "and how often to log, save and validate may change on resume)"
        )


def continues_the_run(meta, config, training):
    """Training from a checkpoint resumes its run, unless it starts quantization-aware
    training from a model trained without (NVIDIA's QAT phase, e.g. of a 2:4 model: new
    optimizer state and schedule; the weights, and the ASP masks, are kept)."""
    if not training or meta is None:
        return False
    return not (config.qat.enabled and not meta["config"].get("qat", {}).get("enabled"))


def check_output_free(config, resuming_meta):
    """A training run writes <output-dir>/<arch>/<epoch>: refuse to mix its checkpoints
    with those of another run already there."""
    folder = os.path.join(config.run.output_dir, config.model.arch)
    saved = ckpt.saved_checkpoints(folder)
    if not saved:
        return
    if resuming_meta is None:
        raise CheckpointError(
            f"{folder} already holds checkpoints of an earlier run "
            f"({ckpt.describe_saved(saved)}): continue it with --from-checkpoint {ckpt.AUTO} "
            f"(or name one of its checkpoints), or choose another --output-dir"
        )
    for _, path in reversed(saved):
        try:
            meta = ckpt.read_meta(os.path.join(path, ckpt.META))
        except CheckpointError:
            continue  # damaged: --from-checkpoint auto skipped it with a warning
        check_same_run(meta, config, path)
        return
