import os
import subprocess
import sys

import numpy as np
import pytest
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from conftest import ROOT, once
from paddle_resnet.core import feeds
from paddle_resnet.core.class_index import read_class_index
from paddle_resnet.core.config import DataConfig
from paddle_resnet.core.errors import DataError
from paddle_resnet.data import dali, records
from paddle_resnet.data.dali import make_loader, open_split
from paddle_resnet.data.folder import scan_split

# Record files and DALI readers: no Paddle API; run once, on 2.6.2.
pytestmark = once

BATCH = 16


@pytest.fixture(scope="module")
def record_root(fmnist_root, tmp_path_factory):
    """The fixture tree written in both formats, side by side."""
    root = str(tmp_path_factory.mktemp("records"))
    for fmt in records.FORMATS:
        records.write_records(fmnist_root, root, fmt)
    return root


def decoded_epoch(read, num_images):
    """Decoded images and labels of one pass of a CPU pipeline, the padded tail cut.

    ``read()`` builds the reader inside the pipeline and returns (encoded, labels).
    """
    pipe = Pipeline(batch_size=BATCH, num_threads=1, device_id=None, seed=7)
    with pipe:
        encoded, labels = read()
        pipe.set_outputs(fn.decoders.image(encoded, device="cpu", output_type=types.RGB), labels)
    pipe.build()
    outputs = [pipe.run() for _ in range(-(-num_images // BATCH))]
    images = np.concatenate([images.as_array() for images, _ in outputs])[:num_images]
    labels = np.concatenate([labels.as_array() for _, labels in outputs])[:num_images]
    return images, labels


def read_in_order(root, split, fmt, shard_id=0, num_shards=1):
    return lambda: dali.read_records(
        root, split, fmt, shard_id, num_shards, random_shuffle=False, seed=0
    )


def read_files(image_list):
    def read():
        encoded, labels = fn.readers.file(
            files=list(image_list.files),
            labels=list(image_list.labels),
            random_shuffle=False,
            pad_last_batch=True,
        )
        return encoded, fn.cast(labels, dtype=types.INT64)

    return read


@pytest.mark.parametrize("fmt", records.FORMATS)
def test_records_give_the_same_val_batches_as_the_files(fmnist_root, record_root, fmt):
    images = scan_split(fmnist_root, "val")
    from_files = decoded_epoch(read_files(images), len(images))
    from_records = decoded_epoch(read_in_order(record_root, "val", fmt), len(images))
    assert len(from_files) == len(from_records) == 2  # images, labels
    for expected, got in zip(from_files, from_records):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    assert from_records[0].shape == (130, 28, 28, 3) and from_records[1].shape == (130, 1)
    assert from_records[1].dtype == np.int64
    assert from_records[1].ravel().tolist() == list(images.labels)


def test_a_shard_reads_the_records_of_its_shard_range(fmnist_root, record_root):
    labels = scan_split(fmnist_root, "val").labels
    shard = records.shard_range(130, 1, 3)
    assert (shard.start, shard.stop) == (43, 86)
    _, got = decoded_epoch(read_in_order(record_root, "val", "recordio", 1, 3), len(shard))
    assert got.ravel().tolist() == list(labels[shard.start : shard.stop])


def test_written_files_counts_and_classes(fmnist_root, record_root):
    classes = scan_split(fmnist_root, "train").classes
    assert read_class_index(os.path.join(record_root, "classes.json")) == list(classes)
    for fmt in records.FORMATS:
        assert records.count_records(record_root, "train", fmt) == 160
        assert records.count_records(record_root, "val", fmt) == 130
        assert records.check_records(record_root, "val", fmt) == 130
    assert not [name for name in os.listdir(record_root) if name.endswith(".tmp")]
    with open(os.path.join(record_root, "val.tfrecord"), "rb") as handle:
        _, _, first = next(records.tfrecord_frames(handle, "val.tfrecord"))
    assert records.feature_kinds(first) == {
        records.ENCODED: "bytes_list",
        records.LABEL: "int64_list",
        records.TEXT: "bytes_list",
    }


def test_missing_record_file_or_index_is_named(record_root, tmp_path):
    for name in ("val.rec", "val.idx"):
        os.link(os.path.join(record_root, name), tmp_path / name)
    os.remove(tmp_path / "val.idx")
    with pytest.raises(
        DataError,
        match=r"val.rec: index file .*val.idx is missing; "
        r"create it with scripts/data/make_records.py",
    ):
        records.count_records(str(tmp_path), "val", "recordio")
    with pytest.raises(DataError, match=r"train.tfrecord: record file is missing"):
        records.record_files(str(tmp_path), "train", "tfrecord")


def example(image_bytes, label, drop=None):
    features = {records.ENCODED: image_bytes, records.LABEL: label}
    features.pop(drop, None)
    return records.encode_example(features)


def test_record_without_label_is_named(fmnist_root, tmp_path):
    """Checked in Python before a pipeline runs, and named again if DALI fails on it."""
    images = scan_split(fmnist_root, "val")
    image_bytes = open(images.files[0], "rb").read()
    prefix = str(tmp_path / "val")
    records.write_tfrecord_examples(
        [example(image_bytes, 0, drop=records.LABEL if i == 3 else None) for i in range(5)], prefix
    )
    message = r"val.tfrecord: record 3 has no 'image/class/label' feature"
    with pytest.raises(DataError, match=message):
        records.check_records(str(tmp_path), "val", "tfrecord")
    # What dali.py sees when it catches the pipeline's RuntimeError:
    with pytest.raises(RuntimeError) as dali_error:
        decoded_epoch(read_in_order(str(tmp_path), "val", "tfrecord"), 5)
    with pytest.raises(DataError, match=message):
        raise dali.describe_record_error(dali_error.value, str(tmp_path), "val", "tfrecord")


def test_malformed_tfrecord_files_are_named(record_root, tmp_path):
    with pytest.raises(DataError, match=r"val.rec: no valid TFRecord header at byte 0"):
        records.check_tfrecord(os.path.join(record_root, "val.rec"))
    path = str(tmp_path / "val.tfrecord")
    records.write_tfrecord_examples([example(b"\xff\xd8", 1)], str(tmp_path / "val"))
    stale_index = os.path.join(record_root, "train.tfrecord.idx")
    with pytest.raises(DataError, match=r"train.tfrecord.idx: does not list the 1 records"):
        records.check_tfrecord(path, stale_index)
    records.write_tfrecord_examples(
        [example(b"\xff\xd8", 1, drop=records.ENCODED)], str(tmp_path / "val")
    )
    with pytest.raises(DataError, match=r"record 0 has no 'image/encoded' feature"):
        records.check_tfrecord(path)
    records.write_tfrecord_examples(
        [records.encode_example({records.ENCODED: b"\xff\xd8", records.LABEL: b"coat"})],
        str(tmp_path / "val"),
    )
    with pytest.raises(
        DataError,
        match=r"record 0: feature 'image/class/label' is bytes_list, "
        r"expected int64_list",
    ):
        records.check_tfrecord(path)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 2)
    with pytest.raises(DataError, match=r"val.tfrecord: truncated in the record at byte 0"):
        records.check_tfrecord(path)


def test_tfrecord_framing_and_a_corrupt_record_is_named(tmp_path):
    frame = records.tfrecord_frame(b"abc")
    assert len(frame) == 8 + 4 + 3 + 4
    assert frame[:8] == (3).to_bytes(8, "little")
    # TFRecord's masked CRC32C of the 8-byte length 3 and of the data, computed apart
    # (bitwise CRC32C, polynomial 0x82F63B78, which gives 0xE3069283 for "123456789";
    # mask ((crc >> 15 | crc << 17) + 0xA282EAD8), as TensorFlow's crc32c.h)
    assert frame[8:12] == (0x0E4999B0).to_bytes(4, "little")
    assert frame[-4:] == (0x21F1576E).to_bytes(4, "little")
    path = str(tmp_path / "val.tfrecord")
    records.write_tfrecord_examples([example(b"\xff\xd8" * 50, 1)] * 2, str(tmp_path / "val"))
    assert records.check_tfrecord(path) == 2
    with open(path, "r+b") as handle:  # one bit of the second record's image flipped
        handle.seek(os.path.getsize(path) - 30)
        byte = handle.read(1)[0]
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte ^ 1]))
    first_frame = os.path.getsize(path) // 2
    with pytest.raises(
        DataError,
        match=rf"val.tfrecord: the record at byte {first_frame} does not match its checksum",
    ):
        records.check_tfrecord(path)


def run_script(*args):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "data", "make_records.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_records_script(fmnist_root, tmp_path):
    done = run_script(
        "--image-root", fmnist_root, "--output", str(tmp_path), "--format", "recordio"
    )
    assert done.returncode == 0, done.stderr
    assert os.path.join(str(tmp_path), "val.idx") in done.stdout.split()
    failed = run_script(
        "--image-root", str(tmp_path / "nowhere"), "--output", str(tmp_path), "--format", "tfrecord"
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("error: ") and failed.stderr.count("\n") == 1
    assert "holds no train/ or val/ folder" in failed.stderr


def test_loaders_give_identical_validation_batches_for_every_format(fmnist_root, tmp_path):
    """The same images through the folder, RecordIO and TFRecord loaders: same batches."""
    passes = {}
    for fmt in ("folder", "recordio", "tfrecord"):
        root = fmnist_root
        if fmt != "folder":
            root = str(tmp_path / fmt)
            records.write_records(fmnist_root, root, fmt)
        cfg = DataConfig(
            image_root=root, format=fmt, batch_size=16, crop_size=28, resize_short=28, num_threads=1
        )
        split = open_split(cfg, "val")
        assert len(split) == 130 and len(split.classes) == 10
        passes[fmt] = list(make_loader(split, cfg, "NCHW", training=False))
    for fmt in ("recordio", "tfrecord"):
        assert len(passes[fmt]) == len(passes["folder"]) == 9
        for ours, reference in zip(passes[fmt], passes["folder"]):
            np.testing.assert_array_equal(ours[feeds.IMAGE], reference[feeds.IMAGE])
            np.testing.assert_array_equal(ours[feeds.LABEL], reference[feeds.LABEL])
