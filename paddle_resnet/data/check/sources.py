"""What the data check reads: each split of an image tree (the loaders' own walk of it) or
of a record set, each giving its images' headers, names and bytes by position."""

import dataclasses
import io
import os
from typing import List, Tuple

from paddle_resnet.core.class_index import CLASSES_FILE, read_class_index
from paddle_resnet.core.errors import DataError
from paddle_resnet.data import records
from paddle_resnet.data.folder import image_root_folder, read_headers, stream_header, walk_split

SPLITS = records.SPLITS


@dataclasses.dataclass
class TreeSplit:
    """One split of an image tree: its image files by class, and what the loaders skip."""

    split: str
    root: str
    classes: Tuple[str, ...]
    files: List[str]
    labels: List[int]
    empty: List[str] = dataclasses.field(default_factory=list)  # class folders
    ignored: List[str] = dataclasses.field(default_factory=list)  # files not named as images
    unfollowed: List[str] = dataclasses.field(default_factory=list)  # linked folders

    @classmethod
    def scan(cls, image_root, split):
        """<image_root>/<split> as the loaders walk it, with what they refuse or skip."""
        tree = walk_split(image_root, split)
        found = (tree.files, tree.labels, tree.empty, tree.ignored, tree.unfollowed)
        return cls(split, image_root, tree.classes, *map(list, found))

    def headers(self):
        return zip(self.labels, read_headers(self.files))

    def name(self, position):
        return os.path.relpath(self.files[position], self.root)

    def content(self, position):
        return records.read_bytes(self.files[position])

    def encoded(self, skip):
        """(position, encoded bytes) of each image but the positions in ``skip``."""
        for position in range(len(self.files)):
            if position not in skip:
                yield position, self.content(position)


@dataclasses.dataclass
class RecordSplit:
    """One split of a record set: its data file, index and the class index beside them."""

    split: str
    fmt: str
    classes: Tuple[str, ...]
    data_path: str
    index_path: str
    offsets: List[int] = dataclasses.field(default_factory=list)  # of each record, as read
    labels: List[int] = dataclasses.field(default_factory=list)

    def _images(self):
        return records.record_format(self.fmt).images(self.data_path, self.index_path)

    def headers(self):
        """(label, ImageHeader) of each record's image: the file is read through once."""
        for offset, label, image in self._images():
            self.offsets.append(offset)
            self.labels.append(label)
            yield label, stream_header(io.BytesIO(image), len(image))

    def name(self, position):
        return f"{os.path.basename(self.data_path)} record {position}"

    def content(self, position):
        return records.record_format(self.fmt).image_at(self.data_path, self.offsets[position])

    def encoded(self, skip):
        for position, (_, _, image) in enumerate(self._images()):
            if position not in skip:
                yield position, image


def open_sources(data_config):
    """The TreeSplit or RecordSplit of each split there is; DataError when there is none."""
    root, fmt = image_root_folder(data_config.image_root), data_config.format
    if fmt == "folder":
        present = [s for s in SPLITS if os.path.isdir(os.path.join(root, s))]
        if not present:
            raise DataError(f"{root}: holds no train/ or val/ folder (expected <split>/<class>/)")
        return {s: TreeSplit.scan(root, s) for s in present}
    present = [s for s in SPLITS if os.path.isfile(records.record_paths(root, s, fmt)[0])]
    if not present:
        raise DataError(f"{root}: holds no {fmt} record files; {records.MAKE_HINT}")
    classes = tuple(read_class_index(os.path.join(root, CLASSES_FILE)))
    return {s: RecordSplit(s, fmt, classes, *records.record_files(root, s, fmt)) for s in present}
