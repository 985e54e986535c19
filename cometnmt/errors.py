"""Exceptions the toolkit raises for bad input, and how their messages name a setting.

Every message names what was wrong and where: the file and line, the dotted config key, or the
checkpoint path. The CLI turns any :class:`CometNMTError` into a one-line message and exit code 2.
"""

from __future__ import annotations


class CometNMTError(Exception):
    """Base class: a user-facing error with a message that is complete on its own."""


class KeyedError(CometNMTError):
    """An error that may name config keys: ``keys``, the dotted keys its message names, the refused
    one first (``("model.n_heads", "model.d_model")``), so that :func:`cometnmt.config.name_origin`
    can say whether a ``--set`` override or a file (and which file of its base chain) gave them;
    empty where none is."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = tuple(keys)


class ConfigError(KeyedError):
    """An unknown config key, a wrong type or a value outside the allowed choices; ``keys`` as
    :class:`KeyedError`'s (load_config names the origin of its rules' errors by them)."""

    @classmethod
    def at(cls, key: str, text: str, also: tuple[str, ...] = ()) -> ConfigError:
        """The error on config key ``key``, written once: "config key 'KEY': TEXT", with ``keys``
        ``(key, *also)``; ``also``: the other keys ``text`` names (``("model.d_model",)``)."""
        return cls(f"config key '{key}': {text}", keys=(key, *also))


class DataError(KeyedError):
    """A missing, malformed, misaligned or corrupt data file. ``keys``: the config keys that named
    the file (``("data.train_src",)``), so that training's own checks can say whether a ``--set``
    override or a file gave them; empty where none did (a file given on the command line)."""


class MisreadInputError(DataError):
    """An input read in pieces that was misread from its start: UTF-16 or UTF-32 whose first bytes
    did not show it, split at 0x0a bytes and read as UTF-8 (corpus.misread_wide_error). What was
    made of the pieces before is no translation of its text, and is not kept for a resumed run."""


class CheckpointError(CometNMTError):
    """A missing, truncated or incompatible checkpoint file."""


class TrainingDiverged(CometNMTError, FloatingPointError):
    """Training stopped because its loss or weights stopped being numbers (NaN, an infinity): a
    diverged model, whose further updates would be NaN too. A FloatingPointError as fairseq's
    "loss is NaN" is; a CometNMTError because its message is complete on its own (the step, the
    loss, which checkpoint is kept, what to change), not a traceback's."""


def setting(name: str, value: object, flags: bool, flag: str | None = None) -> str:
    """How an error names a setting and its value: as the command line's flag (``--batch-size 0``;
    ``flag`` when it is not the keyword with dashes) or as the Python keyword (``batch_size=0``)."""
    return f"{flag or '--' + name.replace('_', '-')} {value}" if flags else f"{name}={value}"


def a_type(value: object) -> str:
    """'an int', 'a list': the type of ``value`` with its article, for messages."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
