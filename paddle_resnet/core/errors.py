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
    """``action()``'s exit status: the int it returns, else 0 (a function that returns what
    it wrote, e.g. a folder, succeeded: ``sys.exit`` of a string would print it and exit
    1). Bad input (UserError) and a file that cannot be written or read (OSError:
    read-only, full disk, a folder where a file should be) become one ``error: ...`` line
    on stderr and exit status 2."""
    try:
        status = action()
        return status if isinstance(status, int) else 0
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
    return 2
