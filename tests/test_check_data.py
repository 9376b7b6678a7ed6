"""paddle-resnet-check-data (``paddle_resnet/data/check/``): each planted problem of an
image tree or its record files is one line, a clean tree exits 0, a missing root one
error line; the check and the loaders read one walk of a tree; a training run starts with
the same check and hands the broken files it screened to its loaders on the splits."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT, once, small_config
from paddle_resnet.core import feeds
from paddle_resnet.core.errors import DataError
from paddle_resnet.data import records, screening
from paddle_resnet.data.check.sources import TreeSplit
from paddle_resnet.data.dali import DataSplit, make_loader
from paddle_resnet.data.folder import ImageList, read_header, scan_split, walk_split
from paddle_resnet.training import run as training_run

# Pillow, DALI and files: no Paddle API; run once, on 2.6.2.
pytestmark = once

CROP = "32"


def check_command(*argv):
    """The tool as a user runs it, its console script (installed beside python): its own
    process, its output and exit status."""
    script = os.path.join(os.path.dirname(sys.executable), "paddle-resnet-check-data")
    return subprocess.run([script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


def write_image(path, size=(40, 30), mode="RGB", seed=0):
    """A JPEG of random colours (every seed its own bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), np.uint8)
    Image.fromarray(pixels).convert(mode).save(path, quality=90)


def planted_tree(root, problems=True):
    """Classes a, b, c in train/ (6 images each), a, b in val/ (3 each); with ``problems``
    an empty class folder in both, and one image each: truncated, CMYK, grayscale among
    colour ones, 6x6 px, and a training image copied into val/."""
    seed = 0
    for split, classes, count in (("train", "abc", 6), ("val", "ab", 3)):
        for name in classes:
            for i in range(count):
                seed += 1
                write_image(root / split / name / f"{i}.jpg", seed=seed)
    if not problems:
        return root
    for split in ("train", "val"):
        (root / split / "empty").mkdir()
    truncated = root / "train" / "a" / "0.jpg"
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) * 2 // 3])
    write_image(root / "train" / "b" / "cmyk.jpg", mode="CMYK", seed=100)
    write_image(root / "val" / "b" / "gray.jpg", mode="L", seed=101)
    write_image(root / "train" / "a" / "tiny.jpg", size=(6, 6), seed=102)
    shutil.copy(root / "train" / "b" / "2.jpg", root / "val" / "a" / "leak.jpg")
    return root


PLANTED = {  # kind: (words of its line, its example)
    "empty_class": ("class folders without images", "train/empty, val/empty"),
    "missing_class": ("missing from a split", "c (not in val)"),
    "broken": ("cut short or corrupt", "train/a/0.jpg"),
    "leak": ("in both the train and val splits", "train/b/2.jpg = val/a/leak.jpg"),
    "cmyk": ("CMYK image (DALI converts them to RGB", "train/b/cmyk.jpg"),
    "gray": ("grayscale image among colour ones", "val/b/gray.jpg"),
    "far_smaller": ("far smaller than the 32-px crop", "train/a/tiny.jpg"),
}


def test_each_planted_problem_is_one_line(tmp_path):
    root = planted_tree(tmp_path / "data")
    report = tmp_path / "check.json"
    result = check_command("--image-root", str(root), "--crop-size", CROP, "--json", str(report))
    assert result.returncode == 1, result.stderr[-2000:]
    findings = [line for line in result.stdout.splitlines() if line.startswith("finding: ")]
    for kind, (words, example) in PLANTED.items():
        lines = [line for line in findings if words in line]
        assert len(lines) == 1 and lines[0].endswith(example), (kind, result.stdout)
    assert len(findings) == len(PLANTED) and result.stdout.splitlines()[-1] == "7 findings"
    document = json.loads(report.read_text())
    assert {f["kind"] for f in document["findings"]} == set(PLANTED)
    assert document["status"] == 1
    assert document["splits"]["train"]["per_class"] == {"a": 7, "b": 7, "c": 6, "empty": 0}


def test_the_demo_tree_passes_with_the_demo_recipe(fmnist_root):
    """Fashion-MNIST's 28-px grayscale JPEGs under the demo's 32-px crop: what the
    pipeline does with them is said in notes, not findings; --decode decodes every one."""
    result = check_command("--image-root", fmnist_root, "--config", "resnet18_demo", "--decode")
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        "train: 10 classes, 160 images, 16 per class",
        "val: 10 classes, 130 images, 13 per class",
    ]
    assert any(line.startswith("note: all 290 images are grayscale (DALI") for line in lines)
    assert any(line.startswith("note: 290 images smaller than the 32-px crop") for line in lines)
    decode = next(line for line in lines if line.startswith("decode: "))
    assert decode.startswith("decode: 290 images by DALI's CPU decoder on ")
    assert decode.endswith(" img/s") and lines[-1] == "no findings"


@pytest.mark.parametrize("fmt", sorted(records.FORMATS))
def test_record_files_are_checked_record_by_record(tmp_path, fmt):
    tree = planted_tree(tmp_path / "tree")
    for folder in ("train/empty", "val/empty", "train/c"):  # make_records refuses these
        shutil.rmtree(tree / folder)
    records.write_records(str(tree), str(tmp_path / fmt), fmt)
    argv = ["--image-root", str(tmp_path / fmt), "--data-format", fmt, "--crop-size", CROP]
    result = check_command(*argv, "--decode")
    assert result.returncode == 1, result.stderr[-2000:]
    out = result.stdout
    named = records.FORMATS[fmt].suffixes[0] + " record "  # train.rec record 5, ...
    for kind in ("broken", "leak", "cmyk", "gray", "far_smaller"):
        words = PLANTED[kind][0]
        lines = [line for line in out.splitlines() if words in line]
        assert len(lines) == 1 and named in lines[0], (kind, out)
    assert "DALI fails on them mid-run" in out
    assert "train: 2 classes, 14 images, 7 per class" in out


def test_a_root_that_is_not_there_is_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    result = check_command("--image-root", str(missing))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: image root '{missing}' does not exist or is not a folder"
    ]


def test_the_loaders_and_the_check_read_one_walk_of_the_tree(tmp_path):
    """One walk (``folder.walk_split``) for both: the class folder the check reports empty
    is the one the loaders refuse, the files it reports skipped are the walk's, and the
    images the loaders train on are the ones it surveys, with the same labels."""
    root = planted_tree(tmp_path / "data")
    (root / "train" / "notes.txt").write_text("outside a class folder")
    (root / "train" / "a" / "labels.csv").write_text("not named as an image")
    checked = TreeSplit.scan(str(root), "train")
    assert [os.path.relpath(p, root) for p in checked.empty] == ["train/empty"]
    assert [os.path.relpath(p, root) for p in checked.ignored] == [
        "train/notes.txt",
        "train/a/labels.csv",
    ]
    with pytest.raises(DataError, match=r"/train/empty: class folder holds no images \("):
        scan_split(str(root), "train")
    shutil.rmtree(root / "train" / "empty")
    loaded, checked = scan_split(str(root), "train"), TreeSplit.scan(str(root), "train")
    assert loaded.classes == checked.classes == ("a", "b", "c") and len(loaded) == 20
    assert (loaded.files, loaded.labels) == (tuple(checked.files), tuple(checked.labels))


def rank_0_alone(name, value, check=None):
    """A job's share of one rank: its own value (the rendezvous' ``share``)."""
    return value


def checked_at_start(config):
    """What a training run's start does with its data: open it, then check it (one rank)."""
    splits = training_run.open_data(config, True, True)[:2]
    return screening.screened(config, *splits, rank=0, share=rank_0_alone)[0]


def test_a_run_starts_with_the_check_and_refuses_broken_images(tmp_path):
    """train.py's data: the check's warnings for the run to print, its broken images
    refused in one line, nothing with --no-data-check."""
    root = planted_tree(tmp_path / "data", problems=False)
    shutil.rmtree(root / "train" / "c")
    shutil.copy(root / "train" / "b" / "2.jpg", root / "val" / "a" / "leak.jpg")
    two = {"model.num_classes": 2}
    config = small_config(str(root), tmp_path / "out", **two)
    lines = checked_at_start(config).lines
    assert lines[0].startswith("data check (") and lines[0].endswith("; 1 finding")
    assert lines[1:] == [
        "warning: 1 image in both the train and val splits (the same bytes: a leak into the "
        "validation figure): train/b/2.jpg = val/a/leak.jpg"
    ]
    skipped = small_config(str(root), tmp_path / "out", **two, **{"check.at_start": False})
    assert checked_at_start(skipped).lines == [] and checked_at_start(skipped).record is None
    (root / "val" / "b" / "1.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    with pytest.raises(DataError, match=r"^\S+/val/b/1.jpg: cannot be decoded as an image$"):
        checked_at_start(config)


def test_the_loaders_take_the_screened_broken_files_from_their_split(tmp_path):
    """The start's screening hands each split's broken files to its loaders
    (``DataSplit.broken``): with --no-data-check they are refused by the loader, from the
    hand-off (a file it names is refused, whatever it holds); a split nobody screened is
    screened by its loader."""
    root = planted_tree(tmp_path / "data", problems=False)
    shutil.rmtree(root / "train" / "c")
    broken = root / "val" / "b" / "1.jpg"
    broken.write_bytes(b"\xff\xd8 not a JPEG")
    values = {"model.num_classes": 2, "check.at_start": False, "data.batch_size": 2}
    config = small_config(str(root), tmp_path / "out", **values)
    splits = training_run.open_data(config, True, True)[:2]
    found, train, val = screening.screened(config, *splits, rank=0, share=rank_0_alone)
    assert found.broken == {"train": [], "val": [4]}
    assert (train.broken, val.broken) == ((), (str(broken),))

    def refused(split, path):
        with pytest.raises(DataError, match=f"^{re.escape(str(path))}: cannot be decoded as"):
            make_loader(split, config.data, "NCHW", training=False)

    refused(val, broken)
    named = val.image_list.files[0]  # a good image
    refused(val.with_broken([named]), named)
    refused(DataSplit.of_images("val", val.image_list), broken)


def test_a_link_back_into_its_split_is_not_followed_and_is_named(tmp_path, capsys):
    """``train/a/loop -> ..`` would give class a every other class's images, and a cycle
    among folders outside the split would walk them twice: the one walk follows neither,
    and names each in one line, train.py's data path as a warning, the data check as a
    finding (exit 1). A link to a folder outside the split is still followed."""
    root = planted_tree(tmp_path / "data", problems=False)
    shutil.rmtree(root / "train" / "c")
    (root / "train" / "a" / "loop").symlink_to("..")
    outside = tmp_path / "more"
    write_image(outside / "x" / "extra.jpg", seed=200)
    (outside / "x" / "again").symlink_to(outside)  # a cycle outside the split
    (root / "train" / "b" / "more").symlink_to(outside)
    tree = walk_split(str(root), "train")
    real = [os.path.realpath(path) for path in tree.files]
    assert len(real) == len(set(real)) == 13  # 6 + 6 + the one outside, each once
    assert tree.labels == (0,) * 6 + (1,) * 7
    loop, again = root / "train" / "a" / "loop", root / "train" / "b" / "more" / "x" / "again"
    assert tree.unfollowed == (str(loop), str(again))

    config = small_config(str(root), tmp_path / "out", **{"model.num_classes": 2})
    capsys.readouterr()
    assert len(training_run.open_data(config, True, True)[0]) == 13
    warned = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1] for line in warned] == [f" {loop}", f" {again}"]
    assert warned[0].startswith("warning: ") and "not followed" in warned[0]

    result = check_command("--image-root", str(root), "--crop-size", CROP)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    findings = [line for line in result.stdout.splitlines() if line.startswith("finding: ")]
    assert findings == [
        "finding: 2 linked folders not followed (it leads back into its split or to a folder "
        "walked already, whose images would count twice; the loaders skip it too): "
        "train/a/loop, train/b/more/x/again"
    ]
    assert "train: 2 classes, 13 images" in result.stdout


def turned_jpeg(path, exif):
    """A 40-px JPEG whose left half is white, with the Exif segment ``exif`` (an
    orientation, or raw bytes)."""
    if isinstance(exif, int):
        tags = Image.Exif()
        tags[0x0112] = exif
        exif = tags.tobytes()
    pixels = np.zeros((40, 40, 3), np.uint8)
    pixels[:, :20] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=95, exif=exif)
    return path


# IFD0 of one entry, big-endian: Orientation (0x0112), a SHORT, 6
MOTOROLA_6 = b"Exif\0\0MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0\0\0\0\0"
BROKEN_EXIF = {  # name: an Exif segment no decoder can take an orientation from
    "far.jpg": b"Exif\0\0II*\0\xff\xff\xff\x7f",  # IFD0 beyond the segment
    "cut.jpg": b"Exif\0\0MM\0*\0\0\0\x08\0\x05\x01\x12",  # entries cut short
    "junk.jpg": b"Exif\0\0" + bytes(range(256)),
    "bare.jpg": b"Exif\0\0",
}


def test_an_exif_orientation_is_a_note_and_dali_turns_the_image_upright(tmp_path):
    """Orientation 6 (turn 90 degrees clockwise; either byte order) is named in a note, 1
    (normal) is not, a broken Exif segment is neither and no crash; DALI's decoder, as the loaders call it,
    turns the image upright (its ``adjust_orientation``): the note says so."""
    root = planted_tree(tmp_path / "data", problems=False)
    shutil.rmtree(root / "train" / "c")
    folder = root / "train" / "a"
    turned, normal = turned_jpeg(folder / "turned.jpg", 6), turned_jpeg(folder / "normal.jpg", 1)
    big_endian = turned_jpeg(folder / "motorola.jpg", MOTOROLA_6)
    orientations = [read_header(str(path)).orientation for path in (turned, normal, big_endian)]
    assert orientations == [6, 1, 6]
    for name, segment in BROKEN_EXIF.items():
        header = read_header(str(turned_jpeg(folder / name, segment)))
        assert header.problem is None and header.orientation is None, name
    result = check_command("--image-root", str(root), "--crop-size", CROP)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    notes = [line for line in result.stdout.splitlines() if "EXIF" in line]
    assert notes == [
        "note: 2 JPEGs with an EXIF orientation other than normal (DALI turns them upright, "
        "as viewers and the server do): train/a/motorola.jpg, train/a/turned.jpg"
    ]

    images = ImageList((str(turned), str(normal)), (0, 0), ("a",))
    sizes = {"data.crop_size": 40, "data.resize_short": 40, "data.batch_size": 2}
    config = small_config(str(root), tmp_path / "out", **sizes)
    (batch,) = make_loader(DataSplit.of_images("val", images), config.data, "NCHW", False)

    def white_half(image):  # its channels averaged: 40 x 40
        halves = {"top": image[:20], "bottom": image[20:], "left": image[:, :20]}
        return max(halves, key=lambda name: halves[name].mean())

    assert [white_half(image) for image in batch[feeds.IMAGE].mean(1)] == ["top", "left"]
