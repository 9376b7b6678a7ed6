"""Each fault its status and its line: a volume that fails to read an image is 75 naming
the file (not a broken image, 2); out of memory in a validation is 75 naming the batch,
and the resume validates that epoch first; a run lock whose holder may have died says how
to take the folder over; images in sub-folders of a class are trained on and counted by
the data check alike; nothing in the toolkit reads the test's fault variable.

A real read error without a failing disk: ``/proc/self/mem`` opens, and reading its first
bytes (an address no process maps) fails with EIO, so an image linked to it fails as a
file on a broken volume does, for whichever process reads it (Pillow's, DALI's)."""

import os
import socket
import subprocess
import sys

import pytest
from PIL import Image

from conftest import FAST_TRAIN, ROOT, once, run_command
from paddle_resnet.core import atomic, errors
from paddle_resnet.core.config import DataConfig
from paddle_resnet.core.errors import RestartableError, UserError
from paddle_resnet.core.report import read_report
from paddle_resnet.data import check
from paddle_resnet.data.dali import DataSplit, make_loader
from paddle_resnet.data.folder import read_header, scan_split

DEVICE_FAULT = "tests/ranks/device_fault.py"
FAILING_READ = "/proc/self/mem"


def small_tree(root, layout):
    """{split: {class: [relative image paths]}}: 8-pixel JPEGs."""
    sample = Image.new("RGB", (8, 8), (200, 10, 10))
    for split, classes in layout.items():
        for name, paths in classes.items():
            for relative in paths:
                path = root / split / name / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                sample.save(path)
    return root


def read_error_line(path):
    return (
        f"{path}: Input/output error while reading it (an I/O error of the file system, not "
        "a broken image: a restart may succeed)"
    )


def test_an_image_the_volume_fails_to_read_is_restartable(tmp_path):
    """The header screening (the data check's, the loaders') and the read behind DALI's
    failure: EIO is the volume's fault (75, naming the file), not a broken image (2)."""
    root = small_tree(tmp_path, {"val": {"a": ["1.jpg", "2.jpg"], "b": ["1.jpg"]}})
    failing = root / "val" / "a" / "3.jpg"
    failing.symlink_to(FAILING_READ)
    with pytest.raises(RestartableError) as fault:
        read_header(str(failing))
    assert str(fault.value) == read_error_line(failing)
    assert errors.describe(fault.value) == (errors.RESTARTABLE, f"error: {fault.value}")
    images = scan_split(str(root), "val")
    config = DataConfig(image_root=str(root), batch_size=2, crop_size=8, resize_short=8)
    with pytest.raises(RestartableError, match="3.jpg: Input/output error"):
        list(make_loader(DataSplit.of_images("val", images), config, "NCHW", False))
    # as if screened clean before the volume failed: DALI's read fails, the line says why
    screened_clean = DataSplit.of_images("val", images).with_broken(())
    with pytest.raises(RestartableError) as fault:
        list(make_loader(screened_clean, config, "NCHW", False))
    assert str(fault.value) == read_error_line(failing)
    # the user's own errors stay a broken image: a file gone
    (root / "val" / "b" / "gone.jpg").symlink_to(root / "nowhere")
    assert read_header(str(root / "val" / "b" / "gone.jpg")).problem == (
        "cannot be read (No such file or directory)"
    )


def linked_tree(source, root):
    """A tree at ``root`` whose class folders are real and whose images link to the
    images of ``source``, to plant a file beside them without touching ``source``."""
    for split in ("train", "val"):
        for name in sorted(os.listdir(os.path.join(source, split))):
            folder = root / split / name
            folder.mkdir(parents=True)
            for image in os.listdir(os.path.join(source, split, name)):
                (folder / image).symlink_to(os.path.join(source, split, name, image))
    return root


@once
def test_a_run_whose_volume_fails_to_read_an_image_ends_75_naming_it(fmnist_root, tmp_path):
    """train.py at its start's data check: 75 and the file, where it ended with 2 calling
    the image broken."""
    root = linked_tree(fmnist_root, tmp_path / "data")
    failing = root / "val" / sorted(os.listdir(root / "val"))[0] / "failing.jpg"
    failing.symlink_to(FAILING_READ)
    result = run_command(
        [sys.executable, "train.py", *FAST_TRAIN, "--image-root", str(root)]
        + ["--output-dir", str(tmp_path / "out")]
    )
    assert result.returncode == errors.RESTARTABLE, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == f"error: {read_error_line(failing)}"
    assert "Traceback" not in result.stderr


def test_images_in_sub_folders_of_a_class_are_of_the_class(tmp_path):
    """train/<class>/<sub>/*.jpg, as torchvision's ImageFolder takes them: the loaders
    train on them and the data check counts them, the same files with the same labels (a
    link back up the tree is not followed: its images are not counted again)."""
    root = small_tree(
        tmp_path,
        {"train": {"a": ["1.jpg", "day/2.jpg", "day/deep/3.jpg"], "b": ["night/4.jpg"]}},
    )
    (root / "train" / "a" / "day" / "notes.txt").write_text("not an image")
    back = root / "train" / "a" / "day" / "back"
    back.symlink_to(root / "train" / "a")
    loaded = scan_split(str(root), "train")
    assert [os.path.relpath(f, root) for f in loaded.files] == [
        "train/a/1.jpg",
        "train/a/day/2.jpg",
        "train/a/day/deep/3.jpg",
        "train/b/night/4.jpg",
    ]
    assert loaded.labels == (0, 0, 0, 1)
    checked = check.TreeSplit.scan(str(root), "train")
    assert (checked.files, tuple(checked.labels)) == (list(loaded.files), loaded.labels)
    assert checked.empty == []  # b holds its image in a sub-folder
    assert checked.ignored == [str(root / "train" / "a" / "day" / "notes.txt")]
    assert checked.unfollowed == [str(back)]


@once
def test_out_of_memory_in_a_validation_is_75_and_the_resume_validates_first(fmnist_root, tmp_path):
    """The validation of epoch 1 runs out of memory at its second batch (planted by the
    tests' driver): 75 in one line naming the batch, the epoch's checkpoint saved before
    it; the same command then validates epoch 1 before anything else, so the run does not
    end without its validation figure."""
    out = tmp_path / "out"
    args = [*FAST_TRAIN, "--image-root", fmnist_root, "--output-dir", str(out)]
    args += ["--dali-num-threads", "1", "--from-checkpoint", "auto"]
    crashed = run_command(
        [sys.executable, DEVICE_FAULT, *args], PADDLE_RESNET_FAULT="out-of-memory@2"
    )
    assert crashed.returncode == errors.RESTARTABLE, crashed.stderr[-3000:]
    assert crashed.stderr.strip().splitlines()[-1] == (
        "error: out of memory (the validation of epoch 1, batch 2 of 9 (16 images): Out of "
        "memory error on GPU 0. Cannot allocate 1.50GB memory on GPU 0, 39.2GB memory has "
        "been allocated (injected at run 2 by PADDLE_RESNET_FAULT).): a restart may succeed"
    )
    assert os.path.isdir(out / "resnet18" / "1")
    report = str(out / "report.json")
    assert not [r for r in read_report(report) if r["type"] == "VAL"]
    resumed = run_command([sys.executable, "train.py", *args])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        f"validating epoch 1 now: {report} holds no validation of it (the start that "
        "saved its checkpoint ended before or during it, e.g. out of memory)"
    ) in resumed.stdout
    assert [r["step"] for r in read_report(report) if r["type"] == "VAL"] == [[1]]


def test_a_lock_whose_holder_may_be_dead_says_how_to_take_the_folder_over(tmp_path):
    """A run lock held for a run on another host (which may have died: a network file
    system keeps a lost client's lock): one line naming the holder and the take-over,
    removing the file; after it the folder is locked anew."""
    lock = tmp_path / atomic.RUN_LOCK
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, b'node-7 pid 4242\\n')\n"
            "print('held', flush=True)\n"
            "time.sleep(120)\n",
            str(lock),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert socket.gethostname() != "node-7"
        with pytest.raises(UserError) as refused:
            with atomic.run_lock(str(tmp_path), "--output-dir out"):
                pass
        assert str(refused.value) == (
            f"--output-dir out is in use by a run on node-7 pid 4242 (it holds {lock} until "
            "it ends): wait for it, or choose another folder. If that run is gone (node-7 "
            "down or cut off: the file server keeps a lost host's lock until its lease ends "
            f"or it restarts, and this host cannot prove it), take the folder over with: rm "
            f"{lock}"
        )
        os.remove(lock)
        with atomic.run_lock(str(tmp_path), "--output-dir out"):
            assert lock.read_text() == f"{socket.gethostname()} pid {os.getpid()}\n"
    finally:
        holder.kill()
        holder.wait()


def test_nothing_in_the_toolkit_reads_the_fault_variable():
    """The planted faults live in the tests' driver (tests/ranks/device_fault.py): a
    PADDLE_RESNET_FAULT left in a job's environment changes no run."""
    package = os.path.join(ROOT, "paddle_resnet")
    readers = [
        os.path.join(folder, name)
        for folder, _, names in os.walk(package)
        for name in names
        if name.endswith(".py") and "PADDLE_RESNET_FAULT" in open(os.path.join(folder, name)).read()
    ]
    assert readers == []
