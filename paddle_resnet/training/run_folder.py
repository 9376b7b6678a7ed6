"""A run's output folder and the policy over its checkpoints: which run it belongs to
(rank 0's lock, the same-run checks), ``Checkpoints``: the newest that verifies
(``--from-checkpoint auto``), retention, a rewind's set-aside copies; and ``Saves``: when
a training run saves and the save itself, which the epochs ask for. ``checkpoint.py`` is
the format: names, the atomic save, verification, reading."""

import contextlib
import dataclasses
import os
import shutil
import time

import numpy as np

from paddle_resnet.core import provenance
from paddle_resnet.core.atomic import check_writable_folder, remove_directory, run_lock
from paddle_resnet.core.config import run_differences
from paddle_resnet.core.errors import CheckpointError, RestartableError
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import ir
from paddle_resnet.training.rendezvous import checkpoint_name_problem
from paddle_resnet.training.sparsity import masks as sparse_masks

# Copies a rewind set aside (``<name>.rewound-<UTC time>``) are removed this many days
# after they were set aside, at the next rewind or retention.
SET_ASIDE_DAYS = 30
REWOUND = ".rewound-"


def arch_folder(output_dir, arch):
    """<output-dir>/<arch>, one run's checkpoints; built here alone, so all agree on it."""
    return os.path.join(output_dir, arch)


def checkpoint_dir(output_dir, arch, name):
    """The checkpoint ``name`` (epochs done, or ``checkpoint.checkpoint_name``) there."""
    return os.path.join(arch_folder(output_dir, arch), str(name))


@contextlib.contextmanager
def claimed(output_dir, rank):
    """While entered, rank 0 holds ``output_dir``'s lock (checked writable first)."""
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
    """Training from a checkpoint resumes its run, unless it starts QAT from a model
    trained without (NVIDIA's QAT phase: new optimizer state and schedule)."""
    if not training or meta is None:
        return False
    return not (config.qat.enabled and not meta["config"].get("qat", {}).get("enabled"))


def check_output_free(config, resuming_meta):
    """Refuse to mix a training run's checkpoints with another run's already there."""
    folder = arch_folder(config.run.output_dir, config.model.arch)
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


def resolve_auto(config, checkpoints, rank, share=None):
    """(``config`` with --from-checkpoint auto replaced by this run's newest checkpoint or
    none, the lines to print); rank 0 chooses and ``share``s it (no ring may exist yet)."""
    run_cfg = config.run
    if run_cfg.from_checkpoint != ckpt.AUTO:
        return config, []
    folder = arch_folder(run_cfg.output_dir, config.model.arch)
    lines, name = [], None
    if rank == 0:
        newest = checkpoints.newest_verified(lines.append)
        name = os.path.basename(newest) if newest else None
    if share is not None:
        name = share("from-checkpoint auto", name, check=checkpoint_name_problem)
    if name:
        chosen = os.path.join(folder, name)
        lines.append(f"--from-checkpoint auto: {chosen}, the newest checkpoint of this run")
    elif run_cfg.run_scope == "eval_only":
        raise CheckpointError(f"--from-checkpoint auto: {folder} holds no checkpoint to evaluate")
    else:
        chosen = None
        lines.append(f"--from-checkpoint auto: no checkpoint in {folder} yet: a fresh start")
    run_cfg = dataclasses.replace(run_cfg, from_checkpoint=chosen)
    return dataclasses.replace(config, run=run_cfg), lines


def rewind(config, checkpoints, meta):
    """A resume from a checkpoint older than others: the newer ones, a branch this run
    abandons, are moved aside (``set_aside_newer``); its line."""
    moved = checkpoints.set_aside_newer((meta["epoch"], meta.get("step_in_epoch", 0)))
    if not moved:
        return []
    return [
        f"rewound to {config.run.from_checkpoint}: the newer checkpoints "
        f"{', '.join(old for old, _ in moved)} moved aside as "
        f"{', '.join(new for _, new in moved)} (--from-checkpoint auto and "
        f"--keep-checkpoints leave them alone; removed after {SET_ASIDE_DAYS} days)"
    ]


class Checkpoints:
    """The checkpoints of one run's folder; each verified once while unchanged (inode,
    size, mtime): retention reads a checkpoint once per run, not at every save."""

    def __init__(self, folder):
        self.folder = folder
        self._verified = set()

    def verify(self, path):
        path = os.path.abspath(path)
        files = []
        for name in sorted(os.listdir(path)):
            stat = os.stat(os.path.join(path, name))
            files.append((name, stat.st_ino, stat.st_size, stat.st_mtime_ns))
        key = (path, tuple(files))
        if key not in self._verified:
            ckpt.verify_checkpoint(path)
            self._verified.add(key)

    def intact(self, path):
        try:
            self.verify(path)
        except CheckpointError:
            return False
        return True

    def newest_verified(self, warn):
        """The newest checkpoint whose files verify, or None; each newer damaged one is
        passed to ``warn`` and skipped. A CheckpointError where every one is damaged."""
        saved = ckpt.saved_checkpoints(self.folder)
        damage = []
        for _, path in reversed(saved):
            try:
                self.verify(path)
                return path
            except CheckpointError as err:
                warn(f"warning: {err}; skipped by --from-checkpoint auto")
                damage.append(str(err))
        if damage:
            raise CheckpointError(
                f"--from-checkpoint auto: every checkpoint in {self.folder} is damaged "
                f"({ckpt.describe_saved(saved)}; the newest: {damage[0]}): restore one from "
                f"a copy, or move the folder aside (mv {self.folder} {self.folder}.damaged) "
                "to start afresh"
            )
        return None

    def remove_superseded(self, written, keep_epochs, resumed_from, drop_mid_epoch=False):
        """Retention after ``written`` was saved: keep the newest ``keep_epochs`` epoch
        checkpoints that verify and remove the older ones and every older mid-epoch one;
        with 0 (keep all) and ``drop_mid_epoch`` (timed saves), the older mid-epoch ones
        alone. Never removed: ``written`` (read back first: a save that does not verify
        removes nothing), the one at ``resumed_from`` (a restart before ``written`` is
        complete still has it), anything newer. A damaged checkpoint is never counted
        among the kept. Old set-aside copies go too. Returns the names removed."""
        if not keep_epochs and not drop_mid_epoch:
            return []
        keep_epochs = keep_epochs or float("inf")
        try:
            self.verify(written)
        except CheckpointError as err:
            raise RestartableError(
                f"{err}: the checkpoint just saved does not read back as written (an I/O "
                "fault of the file system?); no checkpoint was removed"
            ) from None
        progress = ckpt.progress_of(os.path.basename(written))
        kept = 0 if progress[1] else 1
        removed = []
        for (epochs, steps), path in reversed(ckpt.saved_checkpoints(self.folder)):
            if (epochs, steps) >= progress or (epochs, steps) == tuple(resumed_from):
                continue
            if not steps and kept < keep_epochs:
                kept += self.intact(path)
                continue
            remove_directory(path)
            removed.append(os.path.basename(path))
        return removed + self.prune_set_aside()

    def set_aside_newer(self, progress):
        """Move the checkpoints newer than ``progress`` aside as ``<name>.rewound-<UTC
        time>``, a name neither auto nor retention takes; (old name, new name) pairs."""
        if not os.path.isdir(self.folder):
            return []
        self.prune_set_aside()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        moved = []
        newer = [
            name for found, name in ckpt.progress_names(self.folder) if found > tuple(progress)
        ]
        for name in newer:
            aside, count = f"{name}{REWOUND}{stamp}", 1
            while os.path.exists(os.path.join(self.folder, aside)):
                count += 1
                aside = f"{name}{REWOUND}{stamp}-{count}"
            os.rename(os.path.join(self.folder, name), os.path.join(self.folder, aside))
            moved.append((name, aside))
        return moved

    def prune_set_aside(self, now=None):
        """Remove the copies set aside more than ``SET_ASIDE_DAYS`` ago; their names."""
        now = time.time() if now is None else now
        pruned = []
        for name in sorted(os.listdir(self.folder)) if os.path.isdir(self.folder) else []:
            if REWOUND not in name:
                continue
            stamp = name.split(REWOUND, 1)[1][:16]
            try:
                when = time.mktime(time.strptime(stamp, "%Y%m%dT%H%M%SZ")) - time.timezone
            except ValueError:  # not a name a rewind gave
                continue
            if now - when > SET_ASIDE_DAYS * 86400:
                shutil.rmtree(os.path.join(self.folder, name))
                pruned.append(name)
        return pruned


class Saves:
    """A training run's saves from ``start`` (epochs done, steps done in the next; never
    removed): at an epoch's end every --save-interval and after the last; timed, once
    --save-every-minutes has passed by rank 0's clock (``lifecycle.StepAgreement`` makes
    it every rank's); at a stop. Rank 0 writes each, then retention. ``watch``
    (``divergence.Watch``) checks the weights first and learns each checkpoint saved."""

    def __init__(self, session, start, watch):
        self.session, self.start, self.watch = session, start, watch
        self.every_seconds = session.config.run.save_every_minutes * 60
        self.last_save = time.monotonic()

    def clock_says_save(self):
        return (
            self.session.rank == 0
            and self.every_seconds > 0
            and time.monotonic() - self.last_save >= self.every_seconds
        )

    def due_at_epoch_end(self, epoch):
        """Whether rank 0 saves at the end of ``epoch`` (the other ranks never do)."""
        run_cfg = self.session.config.run
        return self.session.rank == 0 and (
            epoch % run_cfg.save_interval == 0 or epoch == run_cfg.epochs or self.clock_says_save()
        )

    def save(self, epochs_done, steps_done):
        """Rank 0's checkpoint after ``epochs_done`` epochs and ``steps_done`` steps, then
        retention; its directory. Every rank has checked the weights first."""
        session = self.session
        config = session.config
        directory = self._directory(epochs_done, steps_done)
        ckpt.save_checkpoint(
            session.programs.train,
            directory,
            {
                "epoch": epochs_done,
                "step_in_epoch": steps_done,
                "global_step": epochs_done * session.steps_per_epoch + steps_done,
                "world_size": session.world_size,
                "arch": config.model.arch,
                "classes": list(session.classes),
                "config": config.to_dict(),
                # the pattern --asp holds and which weights hold it (None when dense)
                "sparsity": sparse_masks.sparsity_record(session.programs.train)
                if config.asp.enabled
                else None,
                "code": dict(provenance.code(), ir=ir.record(config)["name"]),
            },
            prefix=config.run.model_prefix,
        )
        session.report.saved(directory)
        self.watch.saved(directory)
        removed = session.checkpoints.remove_superseded(
            directory,
            config.run.keep_checkpoints,
            self.start,
            drop_mid_epoch=self.every_seconds > 0,
        )
        if removed:
            session.report.print(
                f"removed older checkpoints (--keep-checkpoints): {', '.join(removed)}"
            )
        self.last_save = time.monotonic()
        return directory

    def timed(self, epoch, steps_done):
        """--save-every-minutes: the checkpoint within ``epoch`` after ``steps_done``."""
        self._within(epoch - 1, steps_done, f"in epoch {epoch} at step {steps_done}")

    def stopped(self, epoch, steps_done):
        """The checkpoint of a stop in ``epoch`` after ``steps_done`` steps; its directory."""
        whole = steps_done >= self.session.steps_per_epoch
        epochs_done, within = (epoch, 0) if whole else (epoch - 1, steps_done)
        where = f"in epoch {epoch} at step {steps_done}, stopped by a signal"
        return self._within(epochs_done, within, where)

    def _within(self, epochs_done, steps_done, where):
        """Every rank checks the weights, rank 0 saves, the others wait for it (so a rank
        lost right after finds it complete)."""
        session = self.session
        self.watch.check_weights(where)
        if session.rank == 0:
            self.save(epochs_done, steps_done)
        if session.all_reduce:
            session.all_reduce(np.zeros(4))
        return self._directory(epochs_done, steps_done)

    def _directory(self, epochs_done, steps_done):
        config = self.session.config
        name = ckpt.checkpoint_name(epochs_done, steps_done)
        return checkpoint_dir(config.run.output_dir, config.model.arch, name)
