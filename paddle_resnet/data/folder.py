"""ImageNet-style image trees: <root>/<split>/<class>/<image>, scanned and checked."""

import concurrent.futures
import hashlib
import os
import struct
import sys
from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

from PIL import Image

from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.errors import DataError, RestartableError, os_error_is_users

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class ImageList:
    """Every image of one split with its label; labels index ``classes``."""

    files: Tuple[str, ...]
    labels: Tuple[int, ...]
    classes: Tuple[str, ...]

    def __len__(self):
        return len(self.files)

    def subset(self, positions):
        files, labels = self.files, self.labels
        return ImageList(
            tuple(files[i] for i in positions), tuple(labels[i] for i in positions), self.classes
        )


def folder_contents(folder):
    """(the image files directly inside ``folder``, its other files), sorted; not hidden ones."""
    images, others = [], []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.lower().endswith(IMAGE_EXTENSIONS):
            images.append(path)
        elif not name.startswith(".") and os.path.isfile(path):
            others.append(path)
    return images, others


def class_contents(folder, split_dir=None):
    """(images, other files, linked folders not followed) of ``folder`` and all its
    subfolders, in sorted order, as torchvision's ImageFolder takes a class. Links are
    followed, but not to a folder walked already (a cycle) nor, given ``split_dir``, back
    into the split or above it: either would count the same images twice."""
    images, others, unfollowed = [], [], []
    split_real = split_dir and os.path.realpath(split_dir)

    def leads_back(path, real):  # a link to the split's folder, inside it or above it
        linked = bool(split_real) and os.path.islink(path)
        return linked and os.path.commonpath([real, split_real]) in (real, split_real)

    real = os.path.realpath(folder)
    if leads_back(folder, real):  # a class folder linked into its own split or above
        return images, others, [folder]
    seen = {real}
    for parent, subfolders, _ in os.walk(folder, followlinks=True):
        kept = []
        for name in sorted(subfolders):
            path = os.path.join(parent, name)
            real = os.path.realpath(path)
            if real in seen or leads_back(path, real):
                unfollowed.append(path)
            else:
                seen.add(real)  # when listed, not when walked: two links to one folder
                kept.append(name)
        subfolders[:] = kept
        found, other = folder_contents(parent)
        images.extend(found)
        others.extend(other)
    return images, others, unfollowed


def image_root_folder(image_root):
    """``image_root``, or a DataError saying that it is not given or not a folder."""
    if not image_root:
        raise DataError("no image root given: set --image-root (data.image_root)")
    if not os.path.isdir(image_root):
        raise DataError(f"image root {image_root!r} does not exist or is not a folder")
    return image_root


@dataclass(frozen=True)
class SplitTree:
    """One walk of a split: what the loaders train on and the data check reports."""

    folder: str  # <image_root>/<split>
    classes: Tuple[str, ...]  # every class folder, empty ones too; their order is the labels'
    files: Tuple[str, ...]  # the images, class by class (a class's sub-folders included)
    labels: Tuple[int, ...]
    empty: Tuple[str, ...]  # class folders without images
    ignored: Tuple[str, ...]  # files the loaders skip: outside a class folder, or not images
    unfollowed: Tuple[str, ...]  # linked folders not walked (``class_contents``)

    def image_list(self) -> ImageList:
        """The images the loaders train on; a DataError for a split they refuse."""
        if not self.classes:
            raise DataError(f"{self.folder}: no class folders")
        if self.empty:
            raise DataError(
                f"{self.empty[0]}: class folder holds no images ({', '.join(IMAGE_EXTENSIONS)})"
            )
        return ImageList(self.files, self.labels, self.classes)


def walk_split(image_root, split) -> SplitTree:
    """The one walk of <image_root>/<split>/<class>/*, in sorted order."""
    split_dir = os.path.join(image_root_folder(image_root), split)
    if not os.path.isdir(split_dir):
        raise DataError(f"{split_dir}: missing; expected {image_root}/{split}/<class>/<image>")
    classes = sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())
    ignored = sum(folder_contents(split_dir), [])  # outside a class folder
    files, labels, empty, unfollowed = [], [], [], []
    for label, name in enumerate(classes):
        class_dir = os.path.join(split_dir, name)
        images, others, links = class_contents(class_dir, split_dir)
        if not images:
            empty.append(class_dir)
        files.extend(images)
        labels.extend([label] * len(images))
        ignored.extend(others)
        unfollowed.extend(links)
    return SplitTree(split_dir, *map(tuple, (classes, files, labels, empty, ignored, unfollowed)))


def scan_split(image_root, split) -> ImageList:
    """The images of <image_root>/<split> the loaders train on, or a DataError; a warning
    for each linked folder the walk did not follow, so that missing images are explained."""
    tree = walk_split(image_root, split)
    for path in tree.unfollowed:
        print(
            f"warning: {path}: a link to {os.path.realpath(path)}, not followed (it leads "
            "back into its split or to a folder walked already: its images would count twice)",
            file=sys.stderr,
        )
    return tree.image_list()


def check_same_classes(train: ImageList, val: ImageList):
    if train.classes != val.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise DataError(
            "train and val class folders differ: "
            f"only in train {only_train[:5]}, only in val {only_val[:5]}"
        )


def check_num_classes(image_list: ImageList, num_classes, where):
    if len(image_list.classes) != num_classes:
        raise DataError(
            f"{where} has {len(image_list.classes)} class folders but "
            f"model.num_classes (--num-of-class) is {num_classes}"
        )


def check_class_names(data_classes, model_classes, data_where, model_where):
    """DataError where the data's classes are not the model's: labels would be shifted."""
    data_classes, model_classes = list(data_classes), list(model_classes)
    if data_classes == model_classes:
        return
    only_data = sorted(set(data_classes) - set(model_classes))
    only_model = sorted(set(model_classes) - set(data_classes))
    if only_data or only_model:
        detail = f"only in the data: {only_data[:5]}, only in the model: {only_model[:5]}"
    else:
        label = next(i for i, (a, b) in enumerate(zip(data_classes, model_classes)) if a != b)
        detail = (
            f"the same names in another order: label {label} is "
            f"{data_classes[label]!r} in the data, {model_classes[label]!r} in the model"
        )
    raise DataError(
        f"the class names of {data_where} are not the model's ({model_where}): {detail}"
    )


JPEG_END = b"\xff\xd9"
# How far from the end of a JPEG its end marker may be (cameras append trailers); the
# last TAIL_BYTES are read first, where it nearly always is.
JPEG_TAIL = 64 * 1024
TAIL_BYTES = 4096
# The first bytes of a file, hashed with its size: files of equal keys are the only
# candidates for being the same image (``data/check/duplicates.py`` hashes those whole).
HEAD_BYTES = 4096


class ImageHeader(NamedTuple):
    """What a file's header says, read without decoding the image (for a JPEG)."""

    size: int  # bytes
    format: Optional[str]  # Pillow's: JPEG, PNG, ...
    mode: Optional[str]  # Pillow's: RGB, L, CMYK, P, RGBA, I;16, ...
    width: int
    height: int
    bits: int  # per channel: 8, or 16 for anything deeper
    problem: Optional[str]  # why no decoder can read it, else None
    key: bytes  # digest of the size and the first HEAD_BYTES bytes
    orientation: Optional[int] = None  # a JPEG's EXIF Orientation (``exif_orientation``)


def raise_read_fault(path, err):
    """A RestartableError naming ``path`` for an OSError of the file system (EIO, ESTALE:
    a shared volume that failed, which a restart may find working); nothing for the user's
    (a file gone, no permission) or Pillow's (no errno), which make the file a broken image."""
    if not isinstance(err, OSError) or err.errno is None or os_error_is_users(err):
        return
    raise RestartableError(
        f"{path}: {err.strerror or err} while reading it (an I/O error of the file system, "
        "not a broken image: a restart may succeed)"
    ) from None


def read_header(path):
    """The ImageHeader of the file at ``path`` (about 0.1 ms), or a ``raise_read_fault``."""
    try:
        with open(path, "rb") as handle:
            return stream_header(handle, os.fstat(handle.fileno()).st_size)
    except OSError as err:
        raise_read_fault(path, err)
        return ImageHeader(0, None, None, 0, 0, 0, f"cannot be read ({err.strerror})", b"")


def stream_header(handle, size):
    """The ImageHeader of the ``size`` bytes of the binary ``handle``: Pillow identifies it
    from its header and a JPEG's end marker must be there; other formats (rare, and their
    end is not one marker) are decoded."""
    head = handle.read(HEAD_BYTES)
    key = hashlib.blake2b(size.to_bytes(8, "little") + head, digest_size=16).digest()
    handle.seek(0)
    try:
        with Image.open(handle) as image:
            kind, mode, (width, height) = image.format, image.mode, image.size
            args = image.tile[0][3] if image.tile else ""
            rawmode = args[0] if isinstance(args, tuple) else str(args)
            deep = ";16" in rawmode or mode.startswith("I;16") or mode in ("I", "F")
            problem = None if kind == "JPEG" else _decode_problem(image)
            exif = image.info.get("exif") if kind == "JPEG" else None
    except Exception as err:  # Pillow raises many types for what it cannot identify
        if isinstance(err, OSError) and err.errno is not None:  # the file system's: the caller's
            raise
        return ImageHeader(size, None, None, 0, 0, 0, "not an image", key)
    if kind == "JPEG" and not _jpeg_end_found(handle, size):
        problem = "cut short (no JPEG end marker)"
    bits = 16 if deep else 8
    orientation = exif_orientation(exif) if exif else None
    return ImageHeader(size, kind, mode, width, height, bits, problem, key, orientation)


ORIENTATION_TAG = 0x0112
EXIF_SHORT = 3  # the TIFF type of a 16-bit value


def exif_orientation(exif):
    """The Orientation of IFD0 of a JPEG's Exif segment (its APP1 data as Pillow keeps it),
    or None: absent, or too broken to tell. Reads only IFD0: a few microseconds, where
    Pillow's ``getexif`` parses every entry and warns on the console about broken ones."""
    tiff = exif[6:] if exif.startswith(b"Exif\0\0") else exif
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    try:
        (ifd,) = struct.unpack_from(order + "I", tiff, 4)
        (count,) = struct.unpack_from(order + "H", tiff, ifd)
        for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
            tag, kind, _, value = struct.unpack_from(order + "HHIH", tiff, entry)
            if tag == ORIENTATION_TAG:
                return value if kind == EXIF_SHORT else None
    except (TypeError, struct.error):  # no byte order, or an offset beyond the segment
        return None
    return None


def _decode_problem(image):
    try:
        image.load()
    except Exception as err:  # Pillow raises many types for broken files
        if isinstance(err, OSError) and err.errno is not None:  # the file system's
            raise
        return "cut short or corrupt"
    return None


def _jpeg_end_found(handle, size):
    for tail in (TAIL_BYTES, JPEG_TAIL):
        handle.seek(max(0, size - tail))
        if JPEG_END in handle.read():
            return True
        if tail >= size:
            return False
    return False


# Files per task of ``read_headers``: a million files make a few thousand tasks.
CHUNK = 256


def file_reading_pool():
    """Threads for work that is mostly file reads: twice the cores this process may use."""
    return concurrent.futures.ThreadPoolExecutor(max(4, 2 * available_cores()))


def read_headers(files):
    """The ImageHeader of each of ``files``, in order, read in parallel threads."""
    chunks = [files[i : i + CHUNK] for i in range(0, len(files), CHUNK)]
    with file_reading_pool() as pool:
        for headers in pool.map(lambda chunk: [read_header(path) for path in chunk], chunks):
            yield from headers


def structurally_broken(files):
    """The files of ``files`` that no decoder can read: not an image, or a truncated JPEG.
    DALI 2.4's CPU decoder can crash the process (SIGSEGV in a worker thread) when a
    sample of a batch fails, more often the larger the batch, and prints its own error
    line before ours: the loaders screen their images first (35,000 in 3.4 s on 2 cores),
    where nobody did (``screening.py``)."""
    return tuple(path for path, header in zip(files, read_headers(files)) if header.problem)


def refuse_broken(broken):
    """A DataError naming the first of the ``broken`` files (and how many more), if any."""
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise DataError(f"{broken[0]}: cannot be decoded as an image{more}")


def unreadable_images(files):
    """The files of ``files`` that Pillow cannot decode (a generator), or a ``raise_read_fault``."""
    for path in files:
        try:
            with Image.open(path) as image:
                image.load()
        except Exception as err:  # Pillow raises many types for broken files
            raise_read_fault(path, err)
            yield path


def linked_subset(image_root, destination, train_images):
    """An image tree at ``destination`` linking the first ``train_images`` training images
    of ``image_root`` (spread over its classes) and its validation images, for benchmarks."""
    source = os.path.abspath(image_root)
    classes = sorted(os.listdir(os.path.join(source, "train")))
    per_class = -(-train_images // len(classes))
    for name in classes:
        os.makedirs(os.path.join(destination, "train", name))
        for image in sorted(os.listdir(os.path.join(source, "train", name)))[:per_class]:
            os.symlink(
                os.path.join(source, "train", name, image),
                os.path.join(destination, "train", name, image),
            )
    os.symlink(os.path.join(source, "val"), os.path.join(destination, "val"))
    return destination
