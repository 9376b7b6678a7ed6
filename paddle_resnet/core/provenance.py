"""What code this process runs, as a checkpoint records it (``meta.json``'s "code"): the
toolkit's version, its commit (a git checkout's, or in an image the one its build named:
``COMMIT_VARIABLE``) and Paddle's version. A resume on other code says so in one line
(``difference``): a requeued job may pick up an upgraded checkout or image."""

import functools
import importlib.metadata
import os
import subprocess

import paddle

from paddle_resnet.core.bootstrap import REPOSITORY

PACKAGE = "paddle-resnet"
_CHECKOUT = REPOSITORY  # the checkout the package runs from
# The commit an image was built from: Dockerfile and Dockerfile.gpu put their build argument
# of this name in the image's environment (docker build --build-arg
# PADDLE_RESNET_COMMIT=$(git rev-parse HEAD)).
COMMIT_VARIABLE = "PADDLE_RESNET_COMMIT"


def _checkout_commit():
    """The commit of the checkout the package runs from, or None (no .git, no git)."""
    if not os.path.exists(os.path.join(_CHECKOUT, ".git")):
        return None
    try:
        result = subprocess.run(
            ["git", "-C", _CHECKOUT, "rev-parse", "--verify", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def code():
    """{"toolkit": version, "commit": where there is one, "paddle": version} of this process."""
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout not installed
        version = "unknown"
    record = {"toolkit": version, "paddle": paddle.__version__}
    commit = _checkout_commit() or os.environ.get(COMMIT_VARIABLE, "").strip()
    if commit:
        record["commit"] = commit
    return record


def _describe(record):
    commit = f" (commit {record['commit'][:10]})" if record.get("commit") else ""
    return f"{PACKAGE} {record.get('toolkit', 'unknown')}{commit} on Paddle {record.get('paddle')}"


def difference(recorded):
    """One line when the code ``recorded`` by a checkpoint is not this process's, else None."""
    if not recorded:
        return None
    now = code()
    if all(recorded.get(key) == now.get(key) for key in ("toolkit", "commit", "paddle")):
        return None
    return (
        f"warning: the checkpoint was written by {_describe(recorded)}, this run is "
        f"{_describe(now)}: it continues, on other code (a resumed run is bit-identical to "
        "one never stopped only on the same code)"
    )
