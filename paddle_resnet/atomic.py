"""Writing files so that a crash never leaves a half-written one where a good one was."""
import contextlib
import os
import shutil


@contextlib.contextmanager
def atomic_files(*paths):
    """Binary handles on temporaries that replace ``paths`` only if the block succeeds,
    so a failed or interrupted run never leaves a half-written file in place."""
    os.makedirs(os.path.dirname(os.path.abspath(paths[0])), exist_ok=True)
    temporaries = [path + ".tmp" for path in paths]
    try:
        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(open(temporary, "wb")) for temporary in temporaries]
    except BaseException:
        for temporary in temporaries:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
        raise
    for temporary, path in zip(temporaries, paths):
        os.replace(temporary, path)


def _fsync_dir(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def staged_directory(directory):
    """Yield a hidden sibling folder to fill; on success it replaces ``directory`` by
    renames, on failure it is removed. Either way ``directory`` is never half-written."""
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(directory)}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for name in os.listdir(staging):
        with open(os.path.join(staging, name), "rb+") as handle:
            os.fsync(handle.fileno())
    _fsync_dir(staging)
    if os.path.exists(directory):
        retired = staging + ".old"
        os.replace(directory, retired)
        os.replace(staging, directory)
        shutil.rmtree(retired)
    else:
        os.replace(staging, directory)
    _fsync_dir(parent)
