"""The user-error classes, each printed as one line ``<label>: <message>`` (docs/errors.md). They
live in the lowest module so any layer can raise them; a new kind is a subclass of ``UserError``
with a label.
"""
from __future__ import annotations

import errno
from typing import Any, ClassVar, Optional


class UserError(Exception):
    """Base of every error the user fixes; ``label`` names its kind in the one-line message."""

    label: ClassVar[str] = "error"


class ConfigError(UserError, ValueError):
    """A config key or value is wrong; the message names the key and what to do."""

    label = "config error"


class DataError(UserError, ValueError):
    """A dataset file is missing or wrong; the message names the file."""

    label = "data error"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, truncated, foreign, not writable or does not fit the model."""

    label = "checkpoint error"


class NonFiniteWeightsError(CheckpointError):
    """Refused to save a model whose weights contain NaN/Inf (the previous file is kept)."""

    label = "training stopped"


class MissingStageInput(UserError, FileNotFoundError):
    """A stage's input checkpoint (the previous stage's best.pth) does not exist."""

    label = "missing stage input"


class NonFiniteLossError(UserError, FloatingPointError):
    """The training loss became NaN/Inf; the run stops keeping the last good checkpoint."""

    label = "training stopped"


class DiskError(UserError, OSError):
    """A file the run must write cannot be written: the disk is full, read-only or not ours."""

    label = "disk error"


class ToolError(ValueError):
    """A user error of a command-line tool (``python -m mdk.tools.*``: a bad path, file or
    override): the tool prints ``error: <message>`` and exits with status 1. Not a run's error:
    run.py never sees one."""


# OSErrors that are the machine's or the user's, not a bug: what each means, and its cure.
FREE = ("free space there, or set {keys} to a folder on another disk, then run the same command "
        "again")
WRITABLE = "set {keys} to a folder you can write to"
DISK_REASONS = {errno.ENOSPC: ("the disk is full", FREE),
                errno.EDQUOT: ("the disk quota is used up", FREE),
                errno.EROFS: ("the file system is read-only", WRITABLE),
                errno.EACCES: ("permission denied", "give this user access to it, or " + WRITABLE),
                errno.EPERM: ("permission denied", "give this user access to it, or " + WRITABLE)}
KEYS = "paths.checkpoints, paths.data or hydra.run.dir"  # the folders a run writes


def disk_reason(exc: Optional[BaseException]) -> Optional[str]:
    """What a full/read-only/forbidden disk error means in words, else None."""
    return DISK_REASONS.get(exc.errno, (None,))[0] if isinstance(exc, OSError) else None


def disk_error(exc: OSError, path: Any, what: str = "", keys: str = KEYS) -> DiskError:
    """The DiskError of an OSError while writing ``path``; ``keys`` names the settings that move
    the folder."""
    reason, cure = DISK_REASONS.get(exc.errno, (exc.strerror or str(exc), WRITABLE))
    return DiskError(f"{path}: {reason}; {what + ': ' if what else ''}{cure.format(keys=keys)}")


def user_errors(base: type[UserError] = UserError) -> list[type[UserError]]:
    """Every subclass of ``base`` imported so far."""
    return [c for sub in base.__subclasses__() for c in (sub, *user_errors(sub))]


def error_line(exc: BaseException) -> str | None:
    """``"<label>: <message>"`` for a user error, else None (a bug keeps its traceback). An
    unwrapped OSError of a full, read-only or forbidden disk counts as a user error too."""
    if isinstance(exc, UserError):
        return f"{exc.label}: {exc}"
    if disk_reason(exc) is None:
        return None
    path = getattr(exc, "filename", None) or "a file of this run (unnamed; HYDRA_FULL_ERROR=1 " \
        "shows the traceback)"
    return f"{DiskError.label}: {disk_error(exc, path)}"  # type: ignore[arg-type]

