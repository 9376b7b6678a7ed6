"""The class index: which class name each label stands for, one JSON file
(``{"0": name, ...}``) beside a record set, a training run and an exported model, so that
predictions can be named and a model refused on data of other classes."""

import json

from paddle_resnet.core.atomic import atomic_files
from paddle_resnet.core.errors import DataError
from paddle_resnet.core.text_files import read_json_object

CLASSES_FILE = "classes.json"


def write_class_index(path, classes):
    """{label: folder name} as JSON, so predictions can be named later."""
    text = json.dumps({str(i): name for i, name in enumerate(classes)}, indent=1)
    with atomic_files(path) as (handle,):
        handle.write(text.encode())


def read_class_index(path):
    """The class names at ``path``; a DataError naming it unless {"0": name, ...} JSON."""
    try:
        mapping = read_json_object(path, DataError, 'a class index ({"0": name, ...})')
    except OSError as err:
        raise DataError(f"{path}: not a readable class index ({err})") from None
    names = [mapping.get(str(i)) for i in range(len(mapping))]
    if not all(isinstance(name, str) for name in names):
        label = next(i for i, name in enumerate(names) if not isinstance(name, str))
        raise DataError(
            f"{path}: not a class index: label {label} has no class name "
            '(expected {"0": name, "1": name, ...})'
        )
    return names
