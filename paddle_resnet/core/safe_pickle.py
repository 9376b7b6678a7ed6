"""Pickles read without running code: Paddle's parameter files (``paddle.save``,
``paddle.static.save``: this toolkit's checkpoints, PaddleClas' and NVIDIA's
``.pdparams``), often handed over by others or kept on a shared volume.

A pickle names the functions and classes it calls to rebuild its objects (its globals);
``pickle.load`` imports and calls whichever it names, so a crafted weights file runs
code in every rank that reads it. ``load`` admits only the globals Paddle's parameter
pickles hold and refuses any other (``RefusedGlobal``), before calling it. The globals
listed (pickletools over each format, Paddle 2.6.2 and 3.3.1, NumPy 1.26.4):
``paddle.save`` of a Layer's or an optimizer's state dict, ``paddle.static.save`` of a
legacy or PIR program, ``paddle.save`` of a static program's state dict: NumPy arrays
only (``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``);
with ``protocol=2``, bytes as ``_codecs.encode``; ``paddle.save`` of anything else
(a dict holding other values than tensors) also writes NumPy scalars
(``numpy.core.multiarray.scalar``), each Tensor as ``builtins.tuple`` of (name, array)
and each DenseTensor as ``builtins.eval('data', {'data': array})``, read here as that
array without evaluating anything. NumPy 2 writes ``numpy._core`` where NumPy 1 wrote
``numpy.core``; builtin containers, numbers and strings and ``collections.OrderedDict``
complete the set.
"""

import pickle

import numpy as np

_BUILTINS = (
    "bool",
    "bytearray",
    "bytes",
    "complex",
    "dict",
    "float",
    "frozenset",
    "int",
    "list",
    "set",
    "str",
    "tuple",
)
ADMITTED = frozenset(
    [("builtins", name) for name in _BUILTINS]
    + [
        (core, name)
        for core in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name in ("_reconstruct", "scalar")
    ]
    + [
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),
    ]
)
_PADDLE_DENSE_TENSOR = ("builtins", "eval")


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle asked for a global outside ``ADMITTED``: ``name`` is "module.name"."""

    def __init__(self, name):
        super().__init__(f"asks for {name}")
        self.name = name


def _dense_tensor(*args):
    """What ``paddle.save`` pickles a DenseTensor as, eval('data', {'data': array}): the
    array, with nothing evaluated; any other use of eval is refused."""
    if (
        len(args) == 2
        and args[0] == "data"
        and isinstance(args[1], dict)
        and isinstance(args[1].get("data"), np.ndarray)
    ):
        return args[1]["data"]
    raise RefusedGlobal("builtins.eval")


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == _PADDLE_DENSE_TENSOR:
            return _dense_tensor
        if (module, name) not in ADMITTED:
            raise RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def load(handle):
    """The object pickled in the binary file ``handle``, rebuilt from admitted globals
    only (``RefusedGlobal`` names the first other one; nothing of it was called). Python
    2 strings are read as Latin-1, as Paddle reads them."""
    return _Unpickler(handle, encoding="latin1").load()
