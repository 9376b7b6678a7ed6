"""An InferenceService manifest against KServe's own models (kserve 0.21's
V1beta1InferenceService and the Kubernetes models it nests, as the kserve package
generates them from KServe's OpenAPI), made strict: each field name is looked up in its
model, recursively, and each value's type checked; a field the models lack is an error.
Runs in the serving environment, where kserve is installed (tests/test_serve.py):

    .venv-serve/bin/python tests/kserve_models.py < inferenceservice.yaml

prints {"errors": [[...] for each document of the YAML stream], "extension_fields": [...]}:
the errors, and the fields KServe adds to a predictor's pod spec (its
ComponentExtensionSpec: replicas, scaling, ...), which the caller takes out before it
checks the rest as a Kubernetes PodSpec."""

import json
import re
import sys

import yaml
from kserve import models as kserve_models
from kubernetes.client import models as kubernetes_models

# The generated models' scalar types; "object" is any value (an int or a string: a port)
SCALARS = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
    "object": object,
    "datetime": str,
    "bytes": str,
}
# kserve writes list[X] and dict(str, X), the Kubernetes client List[X] and Dict[str, X]
LIST = re.compile(r"(?:list|List)\[(.+)\]")
MAPPING = re.compile(r"dict\(str, (.+)\)|Dict\[str, (.+)\]")


def model(name):
    return getattr(kserve_models, name, None) or getattr(kubernetes_models, name)


def errors(value, type_name, path, found):
    """Append to ``found`` why ``value`` at ``path`` is not a ``type_name``."""
    if listed := LIST.fullmatch(type_name):
        if not isinstance(value, list):
            found.append(f"{path}: {value!r} is not a list")
            return
        for index, item in enumerate(value):
            errors(item, listed[1], f"{path}[{index}]", found)
    elif mapped := MAPPING.fullmatch(type_name):
        if not isinstance(value, dict):
            found.append(f"{path}: {value!r} is not a mapping")
            return
        for key, item in value.items():
            errors(item, mapped[1] or mapped[2], f"{path}.{key}", found)
    elif type_name in SCALARS:
        wanted = SCALARS[type_name]
        if not isinstance(value, wanted) or (type_name in ("int", "float") and value is True):
            found.append(f"{path}: {value!r} is not of type {type_name}")
    else:
        cls = model(type_name)
        if not isinstance(value, dict):
            found.append(f"{path}: {value!r} is not a {type_name}")
            return
        names = {json_name: attribute for attribute, json_name in cls.attribute_map.items()}
        for key, item in value.items():
            if key not in names:
                found.append(f"{path}: {key!r} is not a field of {type_name}")
            else:
                errors(item, cls.openapi_types[names[key]], f"{path}.{key}", found)


def document_errors(document):
    found = []
    if (document.get("apiVersion"), document.get("kind")) != (
        "serving.kserve.io/v1beta1",
        "InferenceService",
    ):
        found.append(f"not an InferenceService of serving.kserve.io/v1beta1: {document!r:.80}")
    errors(document, "V1beta1InferenceService", "InferenceService", found)
    return found


def main():
    found = [document_errors(document) for document in yaml.safe_load_all(sys.stdin)]
    extension = sorted(kserve_models.V1beta1ComponentExtensionSpec.attribute_map.values())
    print(json.dumps({"errors": found, "extension_fields": extension}))


if __name__ == "__main__":
    main()
