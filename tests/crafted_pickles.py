"""Crafted parameter pickles, one per published way past an allow-list unpickler (and
the segfault of a forged dtype): each written opcode by opcode, so the test reads what
an attacker would write, not what ``pickle.dumps`` of honest objects gives.

``CORPUS`` maps a name, "<technique>/<case>", to the file's bytes. Every one of them is
refused by ``core/safe_pickle`` (tests/test_pickles.py); "forged-dtype/object-field"
is the file that ended every rank reading it with SIGSEGV before.
"""

import pickle
import pickletools
import struct

import numpy as np


def text(value):
    data = value.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(data)]) + data


def raw(data):
    return pickle.BINBYTES + struct.pack("<I", len(data)) + data


def plain(value):
    """The opcodes of a plain value (no globals), without PROTO, STOP or memo."""
    ops = pickletools.optimize(pickle.dumps(value, protocol=2))
    return ops[2:-1]


def name(module, attribute):
    return text(module) + text(attribute) + pickle.STACK_GLOBAL


def call(function, *args):
    """REDUCE of ``function`` (opcodes) with ``args`` (opcodes each)."""
    return function + pickle.MARK + b"".join(args) + pickle.TUPLE + pickle.REDUCE


def build(state):
    return state + pickle.BUILD


def dtype(kind, state=(3, "<", None, None, None, -1, -1, 0), state_ops=None):
    """numpy.dtype(kind, False, True), then BUILD of ``state`` (or of ``state_ops``)."""
    made = call(name("numpy", "dtype"), text(kind), pickle.NEWFALSE, pickle.NEWTRUE)
    return made + build(plain(state) if state_ops is None else state_ops)


def array(dtype_ops, data_ops, shape, fortran=False):
    """An ndarray as NumPy pickles one: _reconstruct, then BUILD of (1, shape, dtype,
    fortran, its bytes)."""
    empty = call(
        name("numpy.core.multiarray", "_reconstruct"),
        name("numpy", "ndarray"),
        plain((0,)),
        pickle.SHORT_BINBYTES + b"\x01b",
    )
    state = (
        pickle.MARK
        + pickle.BININT1
        + b"\x01"
        + plain(shape)
        + dtype_ops
        + (pickle.NEWTRUE if fortran else pickle.NEWFALSE)
        + data_ops
        + pickle.TUPLE
    )
    return empty + build(state)


def state_dict(value_ops, key="conv1.weight"):
    """A file of {key: value}, protocol 4."""
    return (
        pickle.PROTO
        + b"\x04"
        + pickle.EMPTY_DICT
        + text(key)
        + value_ops
        + pickle.SETITEM
        + pickle.STOP
    )


def program(ops):
    return pickle.PROTO + b"\x04" + ops + pickle.STOP


F4 = dtype("f4")
OBJECT = dtype("O8", (3, "|", None, None, None, -1, -1, 63))
# NumPy's state of a structured dtype of one object field, its "holds objects" flag (63)
# forged to 0: the array then reads its raw bytes as object pointers
FORGED = dtype(
    "V8",
    state_ops=pickle.MARK
    + plain(3)
    + text("|")
    + pickle.NONE
    + plain(("a",))
    + pickle.EMPTY_DICT
    + text("a")
    + pickle.MARK
    + OBJECT
    + plain(0)
    + pickle.TUPLE
    + pickle.SETITEM
    + plain(8)
    + plain(1)
    + plain(0)
    + pickle.TUPLE,
)


def _laughs(levels):
    """Lists each holding the one before twice, through the memo: 2**levels leaves."""
    ops = pickle.EMPTY_LIST + pickle.MEMOIZE + pickle.POP
    for level in range(levels):
        ops += pickle.EMPTY_LIST + pickle.MARK + (pickle.BINGET + bytes([level])) * 2
        ops += pickle.APPENDS + pickle.MEMOIZE + pickle.POP
    return ops + pickle.BINGET + bytes([levels])


def _huge(opcode, length_format):
    return state_dict(opcode + struct.pack(length_format, 1 << 40) + b"x")


CORPUS = {
    # other members of the modules the admitted names live in
    "module-wildcard/numpy-frombuffer": state_dict(
        call(name("numpy.core.multiarray", "frombuffer"), raw(b"\0" * 4), text("f4"))
    ),
    "module-wildcard/numpy-load": state_dict(call(name("numpy", "load"), text("/etc/passwd"))),
    "module-wildcard/codecs-decode": state_dict(
        call(name("_codecs", "decode"), text("x"), text("rot13"))
    ),
    "module-wildcard/collections-namedtuple": state_dict(
        call(name("collections", "namedtuple"), text("T"), text("a"))
    ),
    # dotted names, which protocol 4's find_class walks attribute by attribute
    "dotted-name/numpy-core-reconstruct": state_dict(name("numpy", "core.multiarray._reconstruct")),
    "dotted-name/tuple-class": state_dict(name("builtins", "tuple.__class__")),
    "dotted-name/ordered-dict-fromkeys": state_dict(
        call(name("collections", "OrderedDict.fromkeys"), plain(["a"]))
    ),
    "dotted-name/numpy-builtins-eval": state_dict(
        call(name("numpy", "__builtins__.eval"), text("1"))
    ),
    # module attributes by STACK_GLOBAL
    "module-attribute/numpy-builtins": state_dict(name("numpy", "__builtins__")),
    "module-attribute/multiarray-dict": state_dict(name("numpy.core.multiarray", "__dict__")),
    "module-attribute/import": state_dict(call(name("builtins", "__import__"), text("os"))),
    # BUILD on what an admitted name returns: state left in the process
    "build-on-admitted/eval": state_dict(name("builtins", "eval") + build(plain({"x": 1}))),
    "build-on-admitted/ndarray-class": state_dict(
        name("numpy", "ndarray") + build(plain({"x": 1}))
    ),
    "build-on-admitted/dtype-class": state_dict(
        name("numpy", "dtype") + build(plain((None, {"x": 1})))
    ),
    "build-on-admitted/ordered-dict-class": state_dict(
        name("collections", "OrderedDict") + build(plain((None, {"x": 1})))
    ),
    "build-on-admitted/ordered-dict": state_dict(
        call(name("collections", "OrderedDict")) + build(plain({"x": 1}))
    ),
    "build-on-admitted/tuple": state_dict(name("builtins", "tuple") + build(plain({"x": 1}))),
    # the memo replayed
    "memo/list-holding-itself": state_dict(
        pickle.EMPTY_LIST + pickle.MEMOIZE + pickle.BINGET + b"\x00" + pickle.APPEND
    ),
    "memo/laughs": state_dict(_laughs(40)),
    "memo/array-built-twice": state_dict(
        array(F4, raw(b"\0" * 4), (1,))
        + pickle.MEMOIZE
        + pickle.POP
        + pickle.BINGET
        + b"\x00"
        + build(
            pickle.MARK
            + plain(1)
            + plain((2,))
            + F4
            + pickle.NEWFALSE
            + raw(b"\0" * 8)
            + pickle.TUPLE
        )
    ),
    "memo/dtype-forged-after-use": state_dict(
        F4 + pickle.MEMOIZE + build(plain((3, "|", None, ("a",), {"a": None}, 8, 1, 63)))
    ),
    "memo/unset-index": state_dict(pickle.BINGET + b"\x07"),
    # forged dtypes
    "forged-dtype/object-field": state_dict(
        call(name("builtins", "str"), array(FORGED, raw(b"A" * 8), (1,)))
    ),
    "forged-dtype/object-field-kept": state_dict(array(FORGED, raw(b"A" * 8), (1,))),
    "forged-dtype/object": state_dict(OBJECT),
    "forged-dtype/numeric-with-fields": state_dict(
        dtype("f4", (3, "|", None, ("a",), {"a": None}, 4, 1, 0))
    ),
    "forged-dtype/numeric-holding-objects": state_dict(
        dtype("f4", (3, "<", None, None, None, -1, -1, 63))
    ),
    "forged-dtype/numeric-item-size": state_dict(
        array(dtype("f4", (3, "<", None, None, None, 4096, -1, 0)), raw(b"\0" * 4), (1,))
    ),
    "forged-dtype/unicode": state_dict(dtype("U8")),
    # arrays of objects: NumPy pickles their items as a list
    "object-array/numpy-dumps": pickle.dumps(
        {"conv1.weight": np.array([1, None], dtype=object)}, protocol=4
    ),
    "object-array/items-as-list": state_dict(
        array(F4, pickle.EMPTY_LIST + plain(1.0) + pickle.APPEND, (1,))
    ),
    # protocol 5's buffers
    "protocol-5/in-band": pickle.dumps({"conv1.weight": np.ones(3, np.float32)}, protocol=5),
    "protocol-5/next-buffer": program(pickle.NEXT_BUFFER),
    "protocol-5/readonly-buffer": program(raw(b"x") + pickle.READONLY_BUFFER),
    # sizes declared larger than the file
    "huge/bytes8": _huge(pickle.BINBYTES8, "<Q"),
    "huge/unicode8": _huge(pickle.BINUNICODE8, "<Q"),
    "huge/long4": state_dict(pickle.LONG4 + struct.pack("<i", (1 << 31) - 1) + b"x"),
    "huge/frame": pickle.PROTO + b"\x04" + pickle.FRAME + struct.pack("<Q", 1 << 40) + b"x",
    "huge/array-shape": state_dict(array(F4, raw(b"\0" * 4), (1 << 40, 1 << 40))),
    "huge/array-dimensions": state_dict(array(F4, raw(b"\0" * 4), (1,) * 1000)),
    # objects made without a reduce, and Python's other ways to an object
    "other-opcode/inst": program(pickle.MARK + pickle.INST + b"os\nsystem\n"),
    "other-opcode/obj": program(pickle.MARK + name("builtins", "tuple") + pickle.OBJ),
    "other-opcode/newobj": program(
        name("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.NEWOBJ
    ),
    "other-opcode/persistent-id": program(text("x") + pickle.BINPERSID),
    "other-opcode/extension": program(pickle.EXT1 + b"\x01"),
    "other-opcode/reduce-of-a-string": state_dict(text("os") + pickle.EMPTY_TUPLE + pickle.REDUCE),
    "scalar/object-dtype": state_dict(
        call(name("numpy.core.multiarray", "scalar"), OBJECT, plain([1]))
    ),
    "scalar/wrong-size": state_dict(call(name("numpy.core.multiarray", "scalar"), F4, raw(b"\0"))),
}
