"""The exported model as the Open Inference Protocol (KServe v2) sees it, independent of
the server: inputs are read through their ``name``, ``datatype``, ``shape`` and
``as_numpy()`` (KServe's InferInput), outputs are (name, datatype, array).

A request holds one input:
- ``images``: BYTES, shape [n], encoded images (JPEG, PNG), in JSON as base64 strings;
- the export's own input (``data``): FP32, shape [n, *input shape], preprocessed already.
n is 1 to ``max_batch``. The request parameter ``top_k`` (default: 5, or the number of
classes if fewer) sets how many classes ``top_classes`` and ``top_probabilities`` name.
Every refusal is a RequestError (the server answers 400 / INVALID_ARGUMENT)."""

import base64
import binascii
import os
import struct

import numpy as np

from paddle_resnet.core import feeds
from paddle_resnet.core.config.deploy import IMAGE_PIXELS_PER_INPUT_PIXEL
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.metrics import top_k
from paddle_resnet.deploy import exported
from paddle_resnet.deploy.encoded_input import ImagePreprocessing

IMAGES = "images"
PROBABILITIES = "probabilities"
TOP_CLASSES = "top_classes"
TOP_PROBABILITIES = "top_probabilities"
TOP_K = "top_k"


class RequestError(UserError):
    """A request the model cannot answer; the message names what is wrong, in one line."""


def _shape(dims):
    return "[" + ", ".join(map(str, dims)) + "]"


class ServedExport:
    """What the server knows of the exported model in ``model_dir``."""

    def __init__(self, model_dir, info, backend, precision, max_batch, name=None, max_pixels=None):
        self.name = name or os.path.basename(os.path.abspath(model_dir))
        self.classes = exported.read_classes(model_dir)
        self.input_shape = tuple(info["input_shape"])
        self.max_batch = max_batch
        crop = info["preprocess"]["crop_size"]
        self.max_pixels = max_pixels or IMAGE_PIXELS_PER_INPUT_PIXEL * crop * crop
        self.preprocess = ImagePreprocessing(info, self.max_pixels)
        sparsity = exported.sparsity(info)
        self.parameters = {
            "arch": info["arch"],
            "classes": list(self.classes),
            "backend": backend,
            "precision": precision,
            "quantization": (info.get("quantization") or {}).get("method", "none"),
            "sparsity": sparsity["pattern"] if sparsity else "dense",
            "layout": info["layout"],
            "preprocess": info["preprocess"],
            "max_batch": max_batch,
        }

    @property
    def platform(self):
        return f"paddle-resnet_{self.parameters['backend']}_{self.parameters['precision']}"

    def inputs(self):
        return [
            {"name": IMAGES, "datatype": "BYTES", "shape": [-1]},
            {"name": feeds.IMAGE, "datatype": "FP32", "shape": [-1, *self.input_shape]},
        ]

    def outputs(self):
        classes = len(self.classes)
        return [
            {"name": PROBABILITIES, "datatype": "FP32", "shape": [-1, classes]},
            {"name": TOP_CLASSES, "datatype": "BYTES", "shape": [-1, -1]},
            {"name": TOP_PROBABILITIES, "datatype": "FP32", "shape": [-1, -1]},
        ]

    def top_k(self, parameters):
        """The request's ``top_k`` parameter, checked."""
        count = len(self.classes)
        value = (parameters or {}).get(TOP_K, top_k(count))
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= count:
            raise RequestError(
                f"parameter {TOP_K}={value!r}: must be a whole number from 1 to {count} "
                "(the model's classes)"
            )
        return value

    def _one_input(self, inputs):
        either = (
            f"{IMAGES!r} (BYTES, encoded images) or "
            f"{feeds.IMAGE!r} (FP32 {_shape(['n', *self.input_shape])})"
        )
        if len(inputs) != 1:
            raise RequestError(f"a request holds one input, {either}; this one holds {len(inputs)}")
        request_input = inputs[0]
        expected = {IMAGES: "BYTES", feeds.IMAGE: "FP32"}
        if request_input.name not in expected:
            raise RequestError(f"input {request_input.name!r}: this model takes {either}")
        if request_input.datatype != expected[request_input.name]:
            raise RequestError(
                f"input {request_input.name!r} is {request_input.datatype}: expected "
                f"{expected[request_input.name]}"
            )
        return request_input

    def _count(self, request_input, count):
        if count == 0:
            raise RequestError(f"input {request_input.name!r} holds no images")
        if count > self.max_batch:
            raise RequestError(
                f"input {request_input.name!r} holds {count} images: this server takes at "
                f"most {self.max_batch} per request (--max-batch)"
            )

    def _array(self, request_input):
        try:
            return request_input.as_numpy()
        # data that does not fill the shape it declares, BYTES whose length prefixes run past
        # their end (struct.error)
        except (ValueError, TypeError, struct.error) as err:
            raise RequestError(
                f"input {request_input.name!r}: its data does not fit its shape "
                f"{_shape(request_input.shape)} ({err})"
            ) from None

    def request_images(self, inputs):
        """The one input of a request, checked: ("encoded", [bytes, ...]) still to decode,
        or ("tensor", float32 batch)."""
        request_input = self._one_input(inputs)
        shape = list(request_input.shape)
        if any(size < 0 for size in shape):  # [-1] would pass for any number of images
            raise RequestError(
                f"input {request_input.name!r} has shape {_shape(shape)}: sizes are counts"
            )
        if request_input.name == IMAGES:
            if len(shape) != 1 and not (len(shape) == 2 and shape[1] == 1):
                raise RequestError(
                    f"input {IMAGES!r} has shape {_shape(shape)}: expected [n], one encoded "
                    "image each"
                )
            self._count(request_input, shape[0])
            return "encoded", list(self._array(request_input).reshape(-1))
        if len(shape) != 1 + len(self.input_shape) or tuple(shape[1:]) != self.input_shape:
            raise RequestError(
                f"input {feeds.IMAGE!r} has shape {_shape(shape)}: expected "
                f"{_shape(['n', *self.input_shape])}"
            )
        self._count(request_input, shape[0])
        return "tensor", np.ascontiguousarray(self._array(request_input), dtype=np.float32)

    def decode(self, encoded_images):
        """The float32 batch of encoded images (bytes, or base64 text from JSON)."""
        batch = []
        for index, item in enumerate(encoded_images):
            if isinstance(item, str):  # JSON carries bytes as base64 text
                try:
                    item = base64.b64decode(item, validate=True)
                except (binascii.Error, ValueError):
                    raise RequestError(
                        f"{IMAGES}[{index}]: a JSON string must be the image in base64 "
                        "(raw bytes: gRPC or REST's binary data extension)"
                    ) from None
            elif not isinstance(item, (bytes, bytearray)):  # a JSON number, list, ...:
                # bytes(-1) fails, bytes(2**34) is 16 GB of zeros
                raise RequestError(
                    f"{IMAGES}[{index}] is {item!r:.40}, not an encoded image (base64 text in JSON)"
                )
            if not item:
                raise RequestError(f"{IMAGES}[{index}] is empty")
            try:
                batch.append(self.preprocess(bytes(item)))
            except UserError as err:
                raise RequestError(f"{IMAGES}[{index}]: {err}") from None
        return np.stack(batch)

    def outputs_of(self, probabilities, k):
        """[(name, datatype, array)] of the response, the top-k best first."""
        best = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
        names = np.array([[self.classes[i].encode() for i in row] for row in best], dtype=object)
        return [
            (PROBABILITIES, "FP32", probabilities.astype(np.float32, copy=False)),
            (TOP_CLASSES, "BYTES", names),
            (TOP_PROBABILITIES, "FP32", np.take_along_axis(probabilities, best, axis=1)),
        ]
