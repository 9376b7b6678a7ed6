"""Record files of an image tree (MXNet RecordIO or TFRecord) and the DALI readers over them.

    python scripts/data/make_records.py --image-root DIR --output DIR --format recordio|tfrecord

Each split becomes one data file and its index in <output>:
recordio: <split>.rec + <split>.idx; tfrecord: <split>.tfrecord + <split>.tfrecord.idx,
next to classes.json. Validation records keep the order of ``scan_split`` (class by
class), so a record's position is the image's index in the split's ImageList;
training records are written in a fixed shuffled order (see ``shuffled``).

Both formats are written in plain Python, without MXNet or TensorFlow.
"""

import os
import struct

import numpy as np
import nvidia.dali.tfrecord as tfrec
from nvidia.dali import fn, types

from paddle_resnet.atomic import atomic_files
from paddle_resnet.data.folder import ImageList, check_same_classes, scan_split, write_class_index
from paddle_resnet.errors import DataError

FORMATS = ("recordio", "tfrecord")
SPLITS = ("train", "val")
SUFFIXES = {"recordio": (".rec", ".idx"), "tfrecord": (".tfrecord", ".tfrecord.idx")}
MAKE_HINT = "create it with scripts/data/make_records.py"

ENCODED, LABEL, TEXT = "image/encoded", "image/class/label", "image/class/text"

RECORDIO_MAGIC = 0xCED7230A

# tf.train.Feature's oneof field numbers.
BYTES_LIST, INT64_LIST = 1, 3
KIND_NAMES = {1: "bytes_list", 2: "float_list", 3: "int64_list"}
REQUIRED_FEATURES = {ENCODED: BYTES_LIST, LABEL: INT64_LIST}


# ---------------------------------------------------------------- paths and counts


def check_format(fmt):
    if fmt not in FORMATS:
        raise DataError(f"unknown record format {fmt!r}; expected one of {', '.join(FORMATS)}")


def record_paths(root, split, fmt):
    """(data file, index file) of ``split`` in ``root``, whether they exist or not."""
    check_format(fmt)
    data_suffix, index_suffix = SUFFIXES[fmt]
    return os.path.join(root, split + data_suffix), os.path.join(root, split + index_suffix)


def record_files(root, split, fmt):
    """(data file, index file) of ``split`` in ``root``; both must exist."""
    data_path, index_path = record_paths(root, split, fmt)
    if not os.path.isfile(data_path):
        raise DataError(f"{data_path}: record file is missing; {MAKE_HINT}")
    if not os.path.isfile(index_path):
        raise DataError(f"{data_path}: index file {index_path} is missing; {MAKE_HINT}")
    return data_path, index_path


def count_records(root, split, fmt):
    """Number of records of ``split``, as its index lists them (one line each)."""
    _, index_path = record_files(root, split, fmt)
    return len(read_index_lines(index_path))


def read_index_lines(index_path):
    try:
        with open(index_path) as handle:
            return [line.split() for line in handle if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{index_path}: not a readable index file ({err})") from None


def shard_range(num_records, shard_id, num_shards):
    """The records DALI's readers give shard ``shard_id`` (its own formula, so the two agree)."""
    return range(num_records * shard_id // num_shards, num_records * (shard_id + 1) // num_shards)


# ---------------------------------------------------------------- writing


def write_records(image_root, output_root, fmt):
    """Write the train and val splits found under ``image_root``; returns the files written."""
    check_format(fmt)
    splits = [s for s in SPLITS if os.path.isdir(os.path.join(str(image_root), s))]
    if not splits:
        raise DataError(f"image root {image_root!r} holds no train/ or val/ folder")
    # Scan everything first, so a bad tree fails before any file is written.
    image_lists = {split: scan_split(image_root, split) for split in splits}
    if len(image_lists) == 2:
        check_same_classes(image_lists["train"], image_lists["val"])
    write = {"recordio": write_recordio, "tfrecord": write_tfrecord}
    written = []
    try:
        for split, image_list in image_lists.items():
            if split == "train":
                image_list = shuffled(image_list)
            write[fmt](image_list, os.path.join(output_root, split))
            written.extend(record_paths(output_root, split, fmt))
        written.append(os.path.join(output_root, "classes.json"))
        write_class_index(written[-1], image_lists[splits[0]].classes)
    except OSError as err:  # an unreadable image or an unwritable output folder
        raise DataError(f"{err.filename or output_root}: {err.strerror or err}") from None
    return written


def shuffled(image_list, seed=0):
    """The images in a fixed random order: DALI's record readers shuffle only within a
    buffer of records read in stored order, so a class-by-class file would give
    batches of a few classes."""
    order = np.random.RandomState(seed).permutation(len(image_list))
    return ImageList(
        tuple(image_list.files[i] for i in order),
        tuple(image_list.labels[i] for i in order),
        image_list.classes,
    )


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def write_recordio(image_list, prefix):
    """``<prefix>.rec`` and ``<prefix>.idx``: one record per image, key = its index."""
    with atomic_files(prefix + ".rec", prefix + ".idx") as (data, index):
        for key, (path, label) in enumerate(zip(image_list.files, image_list.labels)):
            index.write(f"{key}\t{data.tell()}\n".encode())
            data.write(recordio_record(key, label, read_bytes(path)))


def recordio_record(key, label, image):
    # MXNet's IRHeader: flag 0 means one float label in the header itself.
    payload = struct.pack("<IfQQ", 0, float(label), key, 0) + image
    # The length field's upper 3 bits are a continuation flag (0: a whole record);
    # records start at 4-byte boundaries.
    return struct.pack("<II", RECORDIO_MAGIC, len(payload)) + payload + b"\0" * (-len(payload) % 4)


def write_tfrecord(image_list, prefix):
    """``<prefix>.tfrecord`` and ``<prefix>.tfrecord.idx``: one tf.train.Example per image."""
    write_tfrecord_examples((image_example(image_list, i) for i in range(len(image_list))), prefix)


def image_example(image_list, position):
    label = image_list.labels[position]
    return encode_example(
        {
            ENCODED: bytes_feature(read_bytes(image_list.files[position])),
            LABEL: int64_feature(label),
            TEXT: bytes_feature(image_list.classes[label].encode()),
        }
    )


def write_tfrecord_examples(examples, prefix):
    """Frame serialized Examples into ``<prefix>.tfrecord``, indexed as DALI's tfrecord2idx does."""
    with atomic_files(prefix + ".tfrecord", prefix + ".tfrecord.idx") as (data, index):
        for example in examples:
            frame = tfrecord_frame(example)
            index.write(f"{data.tell()} {len(frame)}\n".encode())
            data.write(frame)


def tfrecord_frame(data):
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


# ---------------------------------------------------------------- protobuf wire format


def varint(value):
    value &= (1 << 64) - 1  # negative int64s are sent as 10-byte two's complement
    encoded = bytearray()
    while value > 0x7F:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def length_delimited(field, payload):
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def bytes_feature(value):
    return length_delimited(BYTES_LIST, length_delimited(1, value))


def int64_feature(value):
    return length_delimited(INT64_LIST, length_delimited(1, varint(value)))  # packed


def encode_example(features):
    """tf.train.Example{features: Features{feature: map<string, Feature>}} from
    {name: encoded Feature}."""
    entries = b"".join(
        length_delimited(1, length_delimited(1, name.encode()) + length_delimited(2, feature))
        for name, feature in features.items()
    )
    return length_delimited(1, entries)


def read_varint(buffer, position):
    value = shift = 0
    while True:
        if position >= len(buffer):
            raise ValueError("truncated varint")
        byte = buffer[position]
        value |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if not byte & 0x80:
            return value, position


def message_fields(buffer):
    """(field number, value) of each field of a message; a length-delimited value is a
    memoryview slice, other values are None (nothing here needs them)."""
    fixed_sizes = {1: 8, 5: 4}
    position = 0
    while position < len(buffer):
        key, position = read_varint(buffer, position)
        field, wire_type = key >> 3, key & 7
        value = None
        if wire_type == 0:
            _, position = read_varint(buffer, position)
        elif wire_type == 2:
            length, position = read_varint(buffer, position)
            value = buffer[position : position + length]
            position += length
        elif wire_type in fixed_sizes:
            position += fixed_sizes[wire_type]
        else:
            raise ValueError(f"unknown wire type {wire_type}")
        if position > len(buffer):
            raise ValueError("truncated field")
        yield field, value


def submessages(buffer, field):
    for number, value in message_fields(buffer):
        if number == field:
            if value is None:
                raise ValueError(f"field {field} is not a message")
            yield value


def feature_kinds(example):
    """{feature name: Feature oneof field number} of a serialized tf.train.Example."""
    kinds = {}
    for features in submessages(memoryview(example), 1):
        for entry in submessages(features, 1):
            name, feature = map_entry(entry)
            kinds[name] = next((number for number, _ in message_fields(feature)), None)
    return kinds


def map_entry(entry):
    """(key, value) of a map<string, Feature> entry; as in protobuf, the last one wins,
    and a missing one is empty."""
    names = [bytes(name).decode("utf-8", "replace") for name in submessages(entry, 1)]
    values = list(submessages(entry, 2))
    return (names[-1] if names else ""), (values[-1] if values else b"")


# ---------------------------------------------------------------- checking TFRecord files


def check_tfrecord(path, index_path=None):
    """Number of records in ``path`` after checking its framing, that every record is an
    Example with an image (bytes) and a label (int64), and that ``index_path`` (if given)
    lists exactly these records.

    DALI reads a missing feature as an empty value: it fails later on a shape mismatch
    that names neither file nor record, or not at all if a whole batch lacks it.
    The data checksums are not verified: pure-Python CRC32C would make the check as
    slow as writing the file.
    """
    frames = []
    try:
        with open(path, "rb") as handle:
            for number, (offset, size, data) in enumerate(tfrecord_frames(handle, path)):
                check_example(data, path, number)
                frames.append([str(offset), str(size)])
    except OSError as err:
        raise DataError(f"{path}: cannot be read ({err.strerror or err})") from None
    if index_path is not None and read_index_lines(index_path) != frames:
        raise DataError(
            f"{index_path}: does not list the {len(frames)} records of {path}; "
            f"re-create both with scripts/data/make_records.py"
        )
    return len(frames)


def tfrecord_frames(handle, path):
    """(offset, frame size, data) of each record, checking each length's checksum."""
    offset = 0
    while True:
        header = handle.read(12)
        if not header:
            return
        if len(header) < 12 or masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
            raise DataError(
                f"{path}: no valid TFRecord header at byte {offset}; "
                "not a TFRecord file, or a corrupt one"
            )
        length = struct.unpack("<Q", header[:8])[0]
        data = handle.read(length)
        if len(data) < length or len(handle.read(4)) < 4:
            raise DataError(f"{path}: truncated in the record at byte {offset}")
        yield offset, length + 16, data
        offset += length + 16


def check_example(data, path, number):
    try:
        kinds = feature_kinds(data)
    except ValueError as err:
        raise DataError(f"{path}: record {number} is not a tf.train.Example ({err})") from None
    for name, kind in REQUIRED_FEATURES.items():
        if name not in kinds:
            raise DataError(f"{path}: record {number} has no {name!r} feature")
        if kinds[name] != kind:
            found = KIND_NAMES.get(kinds[name], "an empty Feature")
            raise DataError(
                f"{path}: record {number}: feature {name!r} is {found}, expected {KIND_NAMES[kind]}"
            )


def check_records(root, split, fmt):
    """Number of records of ``split``; a TFRecord file is checked record by record
    (a RecordIO record always carries its label in its header)."""
    data_path, index_path = record_files(root, split, fmt)
    if fmt == "tfrecord":
        return check_tfrecord(data_path, index_path)
    return count_records(root, split, fmt)


# ---------------------------------------------------------------- CRC32C (TFRecord checksums)


def crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


CRC32C_TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    table = CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    # TFRecord masks its checksums so that CRCs of data holding CRCs stay well spread.
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------- DALI


def read_records(root, split, fmt, shard_id, num_shards, random_shuffle, seed):
    """(encoded images, int64 labels of shape [1]) DALI nodes over the records of ``split``.

    Call inside ``with pipe:``. Each shard is padded to whole batches by repeating its
    last record; ``shard_range`` tells which records the shard holds.

    ``random_shuffle`` is DALI's: it draws from a buffer of 1024 records read in stored
    order (by class). It follows ``seed`` only, not the pipeline's seed.
    """
    data_path, index_path = record_files(root, split, fmt)
    reader_args = dict(
        path=[data_path],
        index_path=[index_path],
        shard_id=shard_id,
        num_shards=num_shards,
        random_shuffle=random_shuffle,
        seed=seed,
        pad_last_batch=True,
        stick_to_shard=True,
        name="Reader",
    )
    if fmt == "recordio":
        encoded, labels = fn.readers.mxnet(**reader_args)  # labels are float32
    else:
        records = fn.readers.tfrecord(features=tfrecord_features(), **reader_args)
        encoded, labels = records[ENCODED], records[LABEL]
    return encoded, fn.cast(labels, dtype=types.INT64)


def tfrecord_features():
    return {
        ENCODED: tfrec.FixedLenFeature((), tfrec.string, ""),
        LABEL: tfrec.FixedLenFeature([1], tfrec.int64, -1),
    }


def describe_record_error(err, root, split, fmt):
    """A one-line DataError for a RuntimeError of a pipeline reading ``split``'s records.

    A TFRecord file is checked first, so a malformed record is named; otherwise the
    message gives the record file and DALI's own reason.
    """
    data_path, index_path = record_paths(root, split, fmt)
    if fmt == "tfrecord":
        try:
            check_tfrecord(data_path, index_path)
        except DataError as malformed:
            return malformed
    return DataError(f"{data_path}: DALI could not read or decode a record ({dali_reason(err)})")


def dali_reason(err):
    """DALI's own reason: the line after "encountered:" (the lines before it name the
    operator and where the pipeline was defined)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if "encountered:" in lines[:-1]:
        return lines[lines.index("encountered:") + 1]
    return lines[0] if lines else type(err).__name__
