"""Errors that reach the user as one line (the entry points print them without a traceback)."""


class UserError(Exception):
    """Bad input from the user: a path, a value, a file. The message names it."""


class ConfigError(UserError):
    """A configuration key or value that cannot be used."""


class DataError(UserError):
    """An image tree, record file or image that cannot be read as asked."""


class CheckpointError(UserError):
    """A checkpoint or parameter file that is missing, truncated or does not fit."""
