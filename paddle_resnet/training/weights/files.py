"""Tensors from a weights file, recognised by its content, not its name.

PyTorch (a zip archive, or the legacy pickle: read with PyTorch, the only thing this
toolkit needs it for), safetensors (no PyTorch), Paddle pickles (read without running
code of the file: ``core/safe_pickle``). A tensor holding nan or inf is refused.
"""

import os
import struct

import numpy as np

from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.core.optional import require
from paddle_resnet.training import checkpoint as ckpt

_ZIP = b"PK\x03\x04"
# pickle protocol 2, then the long 0x1950a86a20f9469cfc6c that torch's legacy format starts with
_TORCH_LEGACY = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
# the wrappers training scripts put around a state dict
_WRAPPERS = ("state_dict", "model", "model_state", "model_state_dict", "module", "params")
# paddle.save of a Layer's state dict adds this mapping beside the tensors
_PADDLE_NAME_TABLE = "StructuredToParameterName@@"


def container(path):
    """ "PyTorch", "safetensors" or "Paddle": what the file at ``path`` holds."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head.startswith(_ZIP) or head.startswith(_TORCH_LEGACY):
        return "PyTorch"
    if (
        len(head) > 8
        and head[8:9] == b"{"
        and struct.unpack("<Q", head[:8])[0] < os.path.getsize(path)
    ):
        return "safetensors"
    return "Paddle"


def read_tensors(path):
    """(container, {name: ndarray}) of a weights file; a CheckpointError naming the file
    if it is missing, truncated or not a weights file."""
    if not os.path.exists(path):
        if os.path.exists(path + ".pdparams"):
            path += ".pdparams"  # the prefix form of this toolkit's files
        else:
            raise CheckpointError(f"{path} does not exist")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path}: is empty, not a weights file")
    kind = container(path)
    readers = {"PyTorch": _read_torch, "safetensors": _read_safetensors, "Paddle": _read_paddle}
    tensors = readers[kind](path)
    if not tensors:
        raise CheckpointError(f"{path}: holds no tensors")
    return kind, tensors


def _unwrap(state):
    for key in _WRAPPERS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            return _unwrap(state[key])
    return state


def _read_torch(path):
    torch = require("torch", f"reading the PyTorch file {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise CheckpointError(
            f"{path}: cannot be read as a PyTorch file (truncated or damaged?): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from None
    state = _unwrap(state)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a state dict")
    tensors = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            dtype = torch.float32 if value.is_floating_point() else value.dtype
            # DistributedDataParallel saves "module.layer1...."
            tensors[name.removeprefix("module.")] = value.detach().to(dtype).numpy()
    return ckpt.check_finite(tensors, path)


def _read_safetensors(path):
    safetensors_numpy = require("safetensors.numpy", f"reading the safetensors file {path}")
    try:
        tensors = dict(safetensors_numpy.load_file(path))
    except Exception as err:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: cannot be read as a safetensors file: {err}") from None
    return ckpt.check_finite(tensors, path)


def _read_paddle(path):
    if path.endswith(".pdparams"):
        # This toolkit's .pdopt beside the parameters holds a QAT run's scales.
        state = ckpt.read_state(path)
    else:
        state = ckpt.read_pickle(path)  # paddle.save writes any file name
    return {
        name: np.asarray(value)
        for name, value in state.items()
        if name != _PADDLE_NAME_TABLE and hasattr(value, "shape")
    }
