"""Text files users hand the toolkit (recipes, class weights, class indexes, an export's
model.json, a checkpoint's meta.json), read as UTF-8: a file that is not UTF-8, not
valid JSON or nested beyond what Python's parsers recurse into is one error naming it
(of the class the caller gives: ``ConfigError``, ``DataError`` ...), not a traceback.
A path that cannot be opened raises its OSError, which names it."""

import json
import os

# What a JSON value other than an object is, as JSON names it.
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number"}


def read_text(path, error, limit=None, what="file"):
    """The text of ``path``; ``error`` when not UTF-8 or over ``limit`` bytes (a ``what``)."""
    if limit is not None and os.path.getsize(path) > limit:
        raise error(
            f"{path}: {os.path.getsize(path):,} bytes, larger than a {what} can be "
            f"({limit:,} bytes at most)"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as err:
        raise error(
            f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
            f"save the {what} as UTF-8"
        ) from None


def parse_json(text, path, error):
    """The JSON value of ``text`` (read from ``path``); ``error`` naming it if not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{path}: nested too deeply to be read as JSON") from None
    except ValueError as err:
        raise error(f"{path}: not valid JSON ({err})") from None


def read_json_object(path, error, what, required=None):
    """The JSON object in ``path``; ``error`` naming it unless one with ``required``'s keys."""
    value = parse_json(read_text(path, error, what=what), path, error)
    if not isinstance(value, dict):
        kind = "true or false" if isinstance(value, bool) else _JSON_KINDS.get(type(value), "null")
        raise error(f"{path}: not {what}: a JSON object is expected, this is {kind}")
    require_keys(value, required or {}, path, error, what)
    return value


def require_keys(mapping, required, path, error, what):
    """``error`` naming the first key of ``required`` ({key: type}) ``mapping`` lacks."""
    for key, kind in required.items():
        if not isinstance(mapping.get(key), kind):
            raise error(f"{path}: not {what}: no {key!r} ({kind.__name__})")
