"""Errors that reach the user as one line: every tool and script ends through
``exit_status``, which prints them without a traceback."""

import sys


class UserError(Exception):
    """Bad input from the user: a path, a value, a file. The message names it."""


class ConfigError(UserError):
    """A configuration key or value that cannot be used."""


class DataError(UserError):
    """An image tree, record file or image that cannot be read as asked."""


class CheckpointError(UserError):
    """A checkpoint or parameter file that is missing, truncated or does not fit."""


def exit_status(action):
    """``action()``'s exit status (0 when it returns None). Bad input (UserError) and a
    file that cannot be written or read (OSError: read-only, full disk, a folder where
    a file should be) become one ``error: ...`` line on stderr and exit status 2."""
    try:
        return action() or 0
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
    return 2
