"""Crash-safe folder replacement: a process SIGKILLed at any step leaves either the old
or the new folder in place once the next run has looked (``recover_staged``)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import once
from paddle_resnet.core import atomic

# Plain file operations: the same on every Paddle version; run once, on 2.6.2.
pytestmark = once

# A child process that replaces ``target`` and SIGKILLs itself after the ``kill_after``-th
# os.replace (0: while the new content is still being written).
CHILD = textwrap.dedent("""
    import os, signal, socket, sys, time
    from paddle_resnet.core import atomic
    target, kill_after = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:                 # another host: the name the folders record
        socket.gethostname = lambda: sys.argv[3]
    real_replace, done = os.replace, []

    def replace(source, destination):
        real_replace(source, destination)
        done.append(destination)
        if len(done) == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace
    with atomic.staged_directory(target) as staging:
        with open(os.path.join(staging, "value"), "w") as handle:
            handle.write("new")
        if kill_after == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if kill_after < 0:                # a live writer: say so, then keep writing
            open(target + ".writing", "w").close()
            time.sleep(60)
""")


def replace_and_die(target, kill_after, host=()):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(target), str(kill_after), *host],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == -9, result.stderr


def content(path):
    with open(os.path.join(path, "value")) as handle:
        return handle.read()


@pytest.mark.parametrize("kill_after, survivor", [(0, "old"), (1, "new"), (2, "new")])
def test_a_killed_replacement_is_finished_or_undone(tmp_path, kill_after, survivor):
    target = tmp_path / "3"
    target.mkdir()
    (target / "value").write_text("old")
    replace_and_die(target, kill_after)
    if kill_after == 1:  # between the two renames: nothing at the path
        assert not target.exists()
    actions = atomic.recover_staged(str(tmp_path))
    assert content(target) == survivor
    assert os.listdir(tmp_path) == ["3"]  # no hidden leftovers
    assert actions or kill_after == 2


def test_a_killed_first_write_leaves_nothing(tmp_path):
    replace_and_die(tmp_path / "1", 0)
    assert atomic.recover_staged(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_live_writers_folder_is_left_alone(tmp_path):
    # The parent of this test process is alive: its staging folder must survive.
    live = tmp_path / f".5.partial-{os.uname().nodename}-{os.getppid()}"
    live.mkdir()
    assert atomic.recover_staged(str(tmp_path)) == []
    assert live.exists()


@pytest.mark.parametrize("kill_after, survivor", [(0, "old"), (1, "new"), (2, "new")])
def test_a_dead_writer_of_another_host_is_recovered(tmp_path, kill_after, survivor):
    """A job restarted on another node finishes or undoes what the dead node left: its
    lock was released with its process, whatever host name the folders record."""
    target = tmp_path / "3"
    target.mkdir()
    (target / "value").write_text("old")
    replace_and_die(target, kill_after, host=["node-b"])
    assert any("node-b" in name for name in os.listdir(tmp_path))
    atomic.recover_staged(str(tmp_path))
    assert content(target) == survivor
    assert os.listdir(tmp_path) == ["3"]  # no hidden folder, no lock file


def test_a_live_writer_of_another_host_is_left_alone(tmp_path):
    target = tmp_path / "4"
    writer = subprocess.Popen([sys.executable, "-c", CHILD, str(target), "-1", "node-b"])
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(str(target) + ".writing"):
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.05)
        before = sorted(os.listdir(tmp_path))
        assert atomic.recover_staged(str(tmp_path)) == []
        assert sorted(os.listdir(tmp_path)) == before  # its staging folder and lock stay
        assert any(name.startswith(".4.partial-node-b-") for name in before)
    finally:
        writer.kill()
        writer.wait()
    atomic.recover_staged(str(tmp_path))
    assert os.listdir(tmp_path) == ["4.writing"]  # dead now: its write removed


def test_a_removal_killed_midway_is_finished_and_leaves_no_half_folder(tmp_path):
    """Retention removes old checkpoints: a kill after the folder is renamed out of sight
    but before it is deleted leaves no half-deleted folder under its own name, and the
    next look finishes the removal."""
    target = tmp_path / "1"
    target.mkdir()
    (target / "value").write_text("old")
    (target / "more").write_text("x")
    code = (
        "import os, shutil, signal, sys\n"
        "from paddle_resnet.core import atomic\n"
        "shutil.rmtree = lambda path, **kw: os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic.remove_directory(sys.argv[1])\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True)
    assert result.returncode == -9, result.stderr
    assert not target.exists()
    assert [name.split(".removed-")[0] for name in os.listdir(tmp_path)] == [".1"]
    actions = atomic.recover_staged(str(tmp_path))
    assert len(actions) == 1 and "finished an interrupted removal" in actions[0]
    assert os.listdir(tmp_path) == []
