import importlib.util
import os

import numpy as np
import pytest
from PIL import Image

from conftest import once, run_python
from paddle_resnet.core import feeds
from paddle_resnet.core.class_index import read_class_index, write_class_index
from paddle_resnet.core.config import DataConfig
from paddle_resnet.core.errors import DataError
from paddle_resnet.data.dali import DataSplit, eval_indices, make_loader, train_indices
from paddle_resnet.data.folder import (
    check_num_classes,
    check_same_classes,
    scan_split,
)

# DALI pipelines against Pillow: no Paddle API; run once, on 2.6.2.
pytestmark = once

MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def data_config(root, **values):
    base = dict(image_root=root, batch_size=16, crop_size=28, resize_short=28, num_threads=2)
    base.update(values)
    return DataConfig(**base)


def test_scan_gives_sorted_classes_and_labels(fmnist_root):
    images = scan_split(fmnist_root, "val")
    assert len(images) == 130 and len(images.classes) == 10
    assert list(images.classes) == sorted(images.classes)
    for path, label in zip(images.files, images.labels):
        assert os.path.basename(os.path.dirname(path)) == images.classes[label]


def test_val_batches_are_the_images_normalised_in_order(fmnist_root):
    images = scan_split(fmnist_root, "val")
    loader = make_loader(
        DataSplit.of_images("x", images), data_config(fmnist_root), "NCHW", training=False
    )
    batches = list(loader)
    assert [len(b[feeds.LABEL]) for b in batches] == [16] * 8 + [2]  # the padded tail is cut
    data = np.concatenate([b[feeds.IMAGE] for b in batches])
    labels = np.concatenate([b[feeds.LABEL] for b in batches])
    assert data.dtype == np.float32 and data.shape == (130, 3, 28, 28)
    assert labels.dtype == np.int64 and labels.shape == (130, 1)
    assert labels.ravel().tolist() == list(images.labels)
    for index in (0, 77, 129):  # compare with Pillow's decode
        pixels = np.asarray(Image.open(images.files[index]).convert("RGB"), dtype=np.float64) / 255
        restored = data[index].transpose(1, 2, 0) * STD + MEAN
        assert np.abs(restored - pixels).max() < 2.5 / 255


def test_nhwc_layout_and_real_imagenet_photos(imagenet_root):
    images = scan_split(imagenet_root, "val")
    cfg = DataConfig(image_root=imagenet_root, batch_size=8, num_threads=2)
    batches = list(make_loader(DataSplit.of_images("x", images), cfg, "NHWC", training=False))
    assert [b[feeds.IMAGE].shape for b in batches] == [(8, 224, 224, 3)] * 2 + [(4, 224, 224, 3)]
    data = np.concatenate([b[feeds.IMAGE] for b in batches])
    assert abs(float(data.mean())) < 1.0 and 0.5 < float(data.std()) < 1.5


def test_training_batches_are_augmented_and_reproducible(fmnist_root):
    images = scan_split(fmnist_root, "train")
    cfg = data_config(fmnist_root, crop_size=24, rand_crop_scale=(0.3, 1.0))

    def epoch_batches(epoch):
        return list(
            make_loader(DataSplit.of_images("x", images), cfg, "NCHW", training=True, epoch=epoch)
        )

    first, again, second = epoch_batches(0), epoch_batches(0), epoch_batches(1)
    assert len(first) == 10 and all(b[feeds.IMAGE].shape == (16, 3, 24, 24) for b in first)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a[feeds.IMAGE], b[feeds.IMAGE])
        np.testing.assert_array_equal(a["label"], b[feeds.LABEL])
    assert not np.array_equal(first[0]["label"], second[0]["label"])
    labels = np.concatenate([b[feeds.LABEL] for b in first]).ravel()
    assert sorted(labels.tolist()) == sorted(images.labels)  # a permutation, no repeats


def test_training_shards_are_disjoint_and_equal_length():
    shards = [train_indices(103, 8, rank, 3, seed=1, epoch=4) for rank in range(3)]
    assert [len(s) for s in shards] == [32, 32, 32]
    assert len(set(np.concatenate(shards).tolist())) == 96


def test_eval_shards_cover_every_image_once():
    shards = [eval_indices(103, rank, 4) for rank in range(4)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(103))


def test_too_few_images_for_a_batch():
    with pytest.raises(DataError, match="no full batch of 64"):
        train_indices(100, 64, 0, 2, seed=0, epoch=0)


def test_class_index_round_trip(tmp_path):
    path = str(tmp_path / "out" / "classes.json")
    write_class_index(path, ["bag", "coat"])
    assert read_class_index(path) == ["bag", "coat"]


def make_tree(root, layout):
    """layout: {split: {class: number of images}}, images copied from a real JPEG."""
    sample = Image.new("RGB", (8, 8), (200, 10, 10))
    for split, classes in layout.items():
        for name, count in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                sample.save(folder / f"{i}.jpg")
    return str(root)


def test_missing_root_and_split(tmp_path):
    with pytest.raises(DataError, match="does not exist or is not a folder"):
        scan_split(str(tmp_path / "nowhere"), "train")
    root = make_tree(tmp_path, {"train": {"a": 1}})
    with pytest.raises(DataError, match=r"val: missing"):
        scan_split(root, "val")


def test_empty_class_folder_is_named(tmp_path):
    root = make_tree(tmp_path, {"train": {"a": 2, "b": 0}})
    with pytest.raises(DataError, match=r"train/b: class folder holds no images"):
        scan_split(root, "train")


def test_class_sets_and_counts_must_agree(tmp_path):
    root = make_tree(tmp_path, {"train": {"a": 1, "b": 1}, "val": {"a": 1, "c": 1}})
    with pytest.raises(DataError, match=r"only in train \['b'\], only in val \['c'\]"):
        check_same_classes(scan_split(root, "train"), scan_split(root, "val"))
    with pytest.raises(DataError, match="has 2 class folders but model.num_classes"):
        check_num_classes(scan_split(root, "train"), 1000, "train")


def test_corrupt_jpeg_is_named(tmp_path):
    root = make_tree(tmp_path, {"val": {"a": 20, "b": 20}})
    broken = tmp_path / "val" / "b" / "7.jpg"
    broken.write_bytes(broken.read_bytes()[:40])
    images = scan_split(root, "val")
    with pytest.raises(DataError, match=r"b/7.jpg: cannot be decoded"):
        list(
            make_loader(
                DataSplit.of_images("x", images),
                DataConfig(
                    image_root=root, batch_size=4, crop_size=8, resize_short=8, num_threads=1
                ),
                "NCHW",
                False,
            )
        )


def test_the_demos_data_writer_exits_0_when_it_writes_and_when_all_is_there(tmp_path):
    """scripts/demo.sh runs it under ``set -e``: its exit status must be 0, the first time
    (it writes) and the next (already complete), with nothing on stderr."""
    output = str(tmp_path / "fm")
    argv = ["scripts/data/fashion_mnist_to_jpeg.py", "--output", output]
    for _ in range(2):
        result = run_python(*argv, "--train-per-class", "2", "--val-per-class", "1")
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert len(os.listdir(os.path.join(output, "train"))) == 10


@once
def test_the_imbalanced_copy_keeps_the_ratio_and_refuses_an_existing_folder(fmnist_root, tmp_path):
    """scripts/data/imbalanced_tree.py as a user runs it: class i of N keeps
    largest * ratio ** (-i / (N - 1)) training images, as links; val is the source's."""
    output = str(tmp_path / "4to1")
    result = run_python("scripts/data/imbalanced_tree.py", fmnist_root, output, "--ratio", "4")
    assert result.returncode == 0, result.stderr
    classes = sorted(os.listdir(os.path.join(fmnist_root, "train")))
    largest = min(len(os.listdir(os.path.join(fmnist_root, "train", c))) for c in classes)
    kept = [len(os.listdir(os.path.join(output, "train", c))) for c in classes]
    assert kept == [round(largest * 4 ** (-i / (len(classes) - 1))) for i in range(len(classes))]
    assert kept[0] == 4 * kept[-1]
    assert os.path.realpath(os.path.join(output, "val")) == os.path.realpath(
        os.path.join(fmnist_root, "val")
    )
    again = run_python("scripts/data/imbalanced_tree.py", fmnist_root, output)
    assert again.returncode == 2
    assert (
        again.stderr.strip() == f"error: {output} exists: remove it or choose another destination"
    )


@once
def test_the_digits_writer_writes_the_uci_digits_or_names_what_it_needs(tmp_path):
    """scripts/data/digits_to_jpeg.py: scikit-learn's 1,797 digits as a JPEG tree (20 % of
    each digit for validation), or, without scikit-learn (requirements-tools.txt), one line."""
    output = str(tmp_path / "digits")
    result = run_python("scripts/data/digits_to_jpeg.py", "--output", output)
    if importlib.util.find_spec("sklearn") is None:
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == (
            "error: writing the digits needs the optional package scikit-learn: "
            "pip install -r requirements-tools.txt"
        )
        return
    assert result.returncode == 0, result.stderr
    counts = {
        split: sum(len(files) for _, _, files in os.walk(os.path.join(output, split)))
        for split in ("train", "val")
    }
    assert counts == {"train": 1438, "val": 359}
    assert sorted(os.listdir(os.path.join(output, "val"))) == [str(d) for d in range(10)]
