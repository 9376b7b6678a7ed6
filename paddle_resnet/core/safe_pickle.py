"""Pickles read without running code or trusting their bytes: Paddle's parameter files
(``paddle.save``, ``paddle.static.save``: this toolkit's checkpoints, PaddleClas' and
NVIDIA's ``.pdparams``), often handed over by others or kept on a shared volume.

A pickle is a program: it names the functions and classes to call (its globals), with
what, and whose state to set (BUILD). ``pickle.load`` calls whatever it names, so a
crafted weights file runs code in every rank that reads it; and even NumPy's own
reconstructors, admitted by name, dereference a pointer the file forges (a structured
dtype with an object field whose "holds objects" flag BUILD set to 0, then an array of
raw bytes read as objects: a segfault). So nothing the file names is called here: each
admitted global is a stand-in that checks its arguments and keeps plain values, and the
arrays are made at the end from the bytes the file holds, by dtype name from
``NUMERIC_DTYPES`` (no dtype state taken from the file beyond its byte order). The
opcodes admitted are those of ``paddle.save`` (state dicts, Tensors, DenseTensors, NumPy
scalars; ``protocol=2`` too) and ``paddle.static.save`` on either IR, as pickletools
reads them (Paddle 2.6.2 and 3.3.1, NumPy 1.26.4). Everything else is ``Refused`` in one
sentence.
"""

import collections
import io
import math
import pickle
import pickletools

import numpy as np

# NumPy's names of its numeric kinds, as it pickles them: numpy.dtype("f4", False, True)
NUMERIC_DTYPES = frozenset("b1 i1 i2 i4 i8 u1 u2 u4 u8 f2 f4 f8 c8 c16".split())
# a numeric dtype's state after its byte order: no subarray, names, fields; sizes and
# flags of the kind (NumPy's BUILD state (3, order, subarray, names, fields, elsize,
# alignment, flags))
_NUMERIC_STATE = (None, None, None, -1, -1, 0)
MAX_DEPTH = 32  # containers in containers: Paddle's files nest three deep
# The pickle opcodes of plain values, containers, the memo and framing; a call only
# through REDUCE of an admitted stand-in, state only through BUILD of an array or dtype.
_OPCODES = """MARK STOP POP POP_MARK DUP FLOAT INT BININT BININT1 LONG BININT2 NONE REDUCE
    STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE APPEND BUILD GLOBAL DICT EMPTY_DICT
    APPENDS GET BINGET LONG_BINGET LIST EMPTY_LIST PUT BINPUT LONG_BINPUT SETITEM TUPLE
    EMPTY_TUPLE SETITEMS BINFLOAT PROTO TUPLE1 TUPLE2 TUPLE3 NEWTRUE NEWFALSE LONG1 LONG4
    BINBYTES SHORT_BINBYTES SHORT_BINUNICODE BINUNICODE8 BINBYTES8 EMPTY_SET ADDITEMS
    FROZENSET STACK_GLOBAL MEMOIZE FRAME""".split()
_CODES = [getattr(pickle, name)[0] for name in _OPCODES]


class Refused(pickle.UnpicklingError):
    """The pickle asks for what parameter files never hold: ``reason`` says what, as a
    phrase after "its pickle"."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class RefusedGlobal(Refused):
    """A global outside the admitted ones: ``name`` is "module.name"."""

    def __init__(self, name):
        super().__init__(f"asks for {name}")
        self.name = name


def _bytes_of(raw, what):
    """The bytes of ``raw``: bytes, or a str of Python 2 pickles read as Latin-1."""
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        return raw.encode("latin1")
    raise Refused(f"gives {what} a {type(raw).__name__} where its bytes belong")


class _DType:
    """numpy.dtype(name, align, copy) of a numeric kind; its BUILD gives the byte order."""

    def __init__(self, name, align=False, copy=True):
        if not (isinstance(name, str) and name in NUMERIC_DTYPES):
            raise Refused(f"asks for the dtype {name!r}, which is no numeric kind")
        self.name, self.order = name, None

    def build(self, state):
        if self.order is not None:
            raise Refused("sets a dtype's state twice")
        if not (
            type(state) is tuple
            and len(state) == 8
            and type(state[0]) is int
            and state[0] == 3
            and type(state[1]) is str
            and state[1] in ("<", ">", "|", "=")
            and all(type(got) is type(want) for got, want in zip(state[2:], _NUMERIC_STATE))
            and state[2:] == _NUMERIC_STATE
        ):
            raise Refused(
                f"gives the dtype {self.name} a state no numeric dtype has "
                "(fields, sizes or flags forged)"
            )
        self.order = state[1]

    def dtype(self):
        plain = np.dtype(self.name)
        return plain.newbyteorder(self.order) if self.order in ("<", ">") else plain


class _Array:
    """numpy.core.multiarray._reconstruct(ndarray, (0,), b'b'): an array to come, whose
    BUILD gives its shape, dtype and bytes; made from those bytes only."""

    def __init__(self, cls, shape, typecode):
        if cls is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
            raise Refused("reconstructs something other than an empty ndarray")
        self.array = None

    def build(self, state):
        if self.array is not None:
            raise Refused("sets an array's state twice")
        if not (type(state) is tuple and len(state) == 5 and state[0] == 1):
            raise Refused("gives an array a state NumPy never writes")
        _, shape, dtype, fortran, raw = state
        if not (
            type(shape) is tuple
            and len(shape) <= 32
            and all(type(size) is int and size >= 0 for size in shape)
        ):
            raise Refused(f"gives an array the shape {shape!r}")
        if not isinstance(dtype, _DType) or type(fortran) is not bool:
            raise Refused("gives an array a dtype that is no numeric dtype")
        raw = _bytes_of(raw, "an array")
        dtype = dtype.dtype()
        count = math.prod(shape)
        if count * dtype.itemsize != len(raw):
            raise Refused(
                f"gives an array of shape {list(shape)} ({dtype}) {len(raw)} bytes, "
                f"not the {count * dtype.itemsize} it needs"
            )
        flat = np.frombuffer(raw, dtype=dtype, count=count)
        self.array = flat.reshape(shape, order="F" if fortran else "C").copy(order="K")


def _scalar(dtype, raw):
    """numpy.core.multiarray.scalar(dtype, bytes): a NumPy number."""
    if not isinstance(dtype, _DType):
        raise Refused("makes a NumPy scalar of a dtype that is no numeric dtype")
    dtype = dtype.dtype()
    raw = _bytes_of(raw, "a NumPy scalar")
    if len(raw) != dtype.itemsize:
        raise Refused(f"gives a {dtype} scalar {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype)[0]


def _dense_tensor(*args):
    """What ``paddle.save`` pickles a DenseTensor as, eval('data', {'data': array}): the
    array, with nothing evaluated; any other use of eval is refused."""
    if (
        len(args) == 2
        and args[0] == "data"
        and type(args[1]) is dict
        and isinstance(args[1].get("data"), _Array)
    ):
        return args[1]["data"]
    raise RefusedGlobal("builtins.eval")


def _tuple(items=()):
    if type(items) not in (tuple, list):
        raise Refused(f"makes a tuple of a {type(items).__name__}")
    return tuple(items)


def _ordered_dict(items=()):
    if type(items) not in (tuple, list) or not all(
        type(item) in (tuple, list) and len(item) == 2 for item in items
    ):
        raise Refused("makes an OrderedDict of something other than pairs")
    return collections.OrderedDict(items)


def _encode(text, encoding="utf-8"):
    """_codecs.encode(str, 'latin1'): bytes as protocol 2 pickles them."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise Refused("encodes something other than a str as Latin-1")
    return text.encode("latin1")


class _Sentinel:
    """An admitted global that is no function: numpy.ndarray, only ever an argument."""

    def __init__(self, name):
        self.name = name


_NDARRAY = _Sentinel("numpy.ndarray")
_STAND_INS = {
    **{
        (core, name): stand_in
        for core in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name, stand_in in (("_reconstruct", _Array), ("scalar", _scalar))
    },
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _DType,
    ("builtins", "tuple"): _tuple,
    ("builtins", "eval"): _dense_tensor,
    ("collections", "OrderedDict"): _ordered_dict,
    ("_codecs", "encode"): _encode,
}
_CALLABLE = frozenset(id(value) for value in _STAND_INS.values() if value is not _NDARRAY)
ADMITTED = frozenset(_STAND_INS)


class _Opcodes(dict):
    def __missing__(self, code):
        op = pickletools.code2op.get(chr(code))
        name = op.name if op else f"0x{code:02x}"
        raise Refused(f"uses the pickle opcode {name}, which parameter files never hold")


class _Bounded:
    """A file's read and readline, refusing a length beyond its end (a size allocates no more)."""

    def __init__(self, handle):
        self.handle = handle
        start = handle.tell()
        self.size = handle.seek(0, io.SEEK_END)
        handle.seek(start)

    def read(self, count):
        if count > self.size - self.handle.tell():
            # a file cut short reads so too: damaged, not crafted
            raise pickle.UnpicklingError(
                f"declares {count} bytes where {self.size - self.handle.tell()} remain"
            )
        return self.handle.read(count)

    def readline(self):
        return self.handle.readline()


class _Unpickler(pickle._Unpickler):
    """Python's own unpickler, with our opcodes: the C one cannot be told which to refuse."""

    def find_class(self, module, name):
        if (module, name) not in _STAND_INS:
            raise RefusedGlobal(f"{module}.{name}")
        return _STAND_INS[module, name]

    def load_reduce(self):
        args = self.stack.pop()
        function = self.stack[-1]
        if id(function) not in _CALLABLE or type(args) is not tuple:
            raise Refused(f"calls a {type(function).__name__}, which is no admitted function")
        self.stack[-1] = function(*args)

    def load_build(self):
        state = self.stack.pop()
        target = self.stack[-1]
        if not isinstance(target, (_Array, _DType)):
            raise Refused(
                f"sets the state of a {type(target).__name__}, which parameter files never do"
            )
        target.build(state)

    dispatch = _Opcodes({code: pickle._Unpickler.dispatch[code] for code in _CODES})
    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.BUILD[0]] = load_build


_LEAVES = (type(None), bool, int, float, complex, str, bytes)


def _plain(value, made, holding, depth):
    """``value`` with every array to come made; a Refused for anything but plain values.
    ``made`` maps a container's id to its copy (a value shared by many is made once),
    ``holding`` the ids of the containers holding this one."""
    if type(value) in _LEAVES or isinstance(value, np.generic):
        return value
    if isinstance(value, _Array):
        if value.array is None:
            raise Refused("holds an array it never gives bytes")
        return value.array
    kind = type(value)
    if kind not in (dict, collections.OrderedDict, list, tuple, set, frozenset):
        raise Refused(f"holds a {kind.__name__} where parameter files hold arrays")
    key = id(value)
    if key in made:
        return made[key]
    if key in holding:
        raise Refused(f"holds a {kind.__name__} that holds itself")
    if depth >= MAX_DEPTH:
        raise Refused(f"nests containers more than {MAX_DEPTH} deep")
    holding.add(key)
    if kind in (dict, collections.OrderedDict):
        copy = kind(
            (_key(item, made, holding, depth), _plain(item_value, made, holding, depth + 1))
            for item, item_value in value.items()
        )
    elif kind in (set, frozenset):
        copy = kind(_key(item, made, holding, depth) for item in value)
    else:
        copy = kind(_plain(item, made, holding, depth + 1) for item in value)
    holding.discard(key)
    made[key] = copy
    return copy


def _key(value, made, holding, depth):
    """A dict key or set member: hashable once made (no array)."""
    made_value = _plain(value, made, holding, depth + 1)
    try:
        hash(made_value)
    except TypeError:
        raise Refused(f"keys a dict or set by a {type(made_value).__name__}") from None
    return made_value


def load(handle):
    """The object pickled in the binary file ``handle``, made by this module (``Refused``
    says what else the file asked for; nothing of it was called). Python 2 strings are
    read as Latin-1, as Paddle reads them."""
    loaded = _Unpickler(_Bounded(handle), encoding="latin1").load()
    return _plain(loaded, {}, set(), 0)
