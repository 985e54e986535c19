"""Exceptions the toolkit raises for bad input.

Every message names what was wrong and where: the file and line, the dotted config key, or the
checkpoint path. The CLI turns any :class:`CometNMTError` into a one-line message and exit code 2.
"""


class CometNMTError(Exception):
    """Base class: a user-facing error with a message that is complete on its own."""


class ConfigError(CometNMTError):
    """An unknown config key, a wrong type or a value outside the allowed choices."""


class DataError(CometNMTError):
    """A missing, malformed, misaligned or corrupt data file."""


class CheckpointError(CometNMTError):
    """A missing, truncated or incompatible checkpoint file."""
