"""ImageNet-style image trees: <root>/<split>/<class>/<image>, scanned and checked."""

import concurrent.futures
import functools
import os
from dataclasses import dataclass
from typing import List, Tuple

from PIL import Image

from paddle_resnet.core.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class ImageList:
    """Every image of one split with its label; labels index ``classes``."""

    files: Tuple[str, ...]
    labels: Tuple[int, ...]
    classes: Tuple[str, ...]

    def __len__(self):
        return len(self.files)


def list_images(folder):
    """The image files directly inside ``folder``, sorted by name."""
    return [
        os.path.join(folder, name)
        for name in sorted(os.listdir(folder))
        if name.lower().endswith(IMAGE_EXTENSIONS)
    ]


def images_under(folder):
    """The image files in ``folder`` and all its subfolders, in sorted order."""
    files = []
    for parent, subfolders, _ in os.walk(folder):
        subfolders.sort()
        files.extend(list_images(parent))
    return files


def scan_split(image_root, split) -> ImageList:
    """List <image_root>/<split>/<class>/* in a fixed (sorted) order."""
    if not image_root:
        raise DataError("no image root given: set --image-root (data.image_root)")
    if not os.path.isdir(image_root):
        raise DataError(f"image root {image_root!r} does not exist or is not a folder")
    split_dir = os.path.join(image_root, split)
    if not os.path.isdir(split_dir):
        raise DataError(f"{split_dir}: missing; expected {image_root}/{split}/<class>/<image>")
    classes = sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())
    if not classes:
        raise DataError(f"{split_dir}: no class folders")
    files: List[str] = []
    labels: List[int] = []
    for label, name in enumerate(classes):
        class_dir = os.path.join(split_dir, name)
        images = list_images(class_dir)
        if not images:
            raise DataError(
                f"{class_dir}: class folder holds no images ({', '.join(IMAGE_EXTENSIONS)})"
            )
        files.extend(images)
        labels.extend([label] * len(images))
    return ImageList(tuple(files), tuple(labels), tuple(classes))


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
    """DataError naming the differing class names when the data's classes are not the
    model's: every label would be silently shifted."""
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
# How far from the end of a JPEG its end marker may be (cameras append trailers).
JPEG_TAIL = 64 * 1024


def _fails_to_open(path):
    """True unless Pillow identifies ``path`` and, for a JPEG, its end-of-image marker is
    there: the structure a decoder needs, checked without decoding (about 0.1 ms)."""
    try:
        with Image.open(path) as image:
            if image.format != "JPEG":
                image.load()  # rare formats: decode them
                return False
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - JPEG_TAIL))
            return JPEG_END not in handle.read()
    except Exception:  # Pillow raises many types for broken files
        return True


@functools.lru_cache(maxsize=8)
def structurally_broken(files):
    """The files of the tuple ``files`` that no decoder can read: not an image, or a
    truncated JPEG. DALI 2.4's CPU decoder can crash the process (SIGSEGV in a worker
    thread) when a sample of a batch fails, more often the larger the batch, and prints
    its own error line before ours: the loaders screen their images first. About 0.1 ms
    a file (35,000 in 3.4 s on 2 cores), in parallel threads (the work is file reads);
    remembered per file list, so every epoch after the first screens nothing."""
    with concurrent.futures.ThreadPoolExecutor(max(4, 2 * (os.cpu_count() or 1))) as pool:
        failed = list(pool.map(_fails_to_open, files, chunksize=64))
    return tuple(path for path, broken in zip(files, failed) if broken)


def unreadable_images(files):
    """The files of ``files`` that Pillow cannot decode, one by one (a generator)."""
    for path in files:
        try:
            with Image.open(path) as image:
                image.load()
        except Exception:  # Pillow raises many types for broken files
            yield path


def linked_subset(image_root, destination, train_images):
    """An image tree at ``destination`` holding the first ``train_images`` training images
    of ``image_root`` (spread over its classes, as symbolic links) and all of its
    validation images: a short epoch of the same data, for benchmarks."""
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
