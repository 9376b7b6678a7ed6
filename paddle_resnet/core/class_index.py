"""The class index: which class name each label stands for, one JSON file
(``{"0": name, ...}``) beside a record set, a training run and an exported model, so that
predictions can be named and a model refused on data of other classes."""

import json

from paddle_resnet.core.atomic import atomic_files
from paddle_resnet.core.errors import DataError

CLASSES_FILE = "classes.json"


def write_class_index(path, classes):
    """{label: folder name} as JSON, so predictions can be named later."""
    with atomic_files(path) as (handle,):
        handle.write(
            json.dumps({str(i): name for i, name in enumerate(classes)}, indent=1).encode()
        )


def read_class_index(path):
    try:
        with open(path) as handle:
            mapping = json.load(handle)
        return [mapping[str(i)] for i in range(len(mapping))]
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"{path}: not a readable class index ({err})") from None
