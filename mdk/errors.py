"""The user-error classes: a bad config, dataset, checkpoint, disk, or a run that cannot go on.

Each carries its ``label``, the words the user sees before its message (``config error: ...``):
a user error is one line on stderr, not a traceback, from whichever process raised it (the
parent, a rank or a loader worker). They live in the lowest module so any layer can raise them
without importing a higher one. A new kind is a subclass of ``UserError`` with a label; every
list of kinds (the one-line printer, the loader's unwrap, fault injection) is ``user_errors()``.
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
    """A dataset file is missing or wrong; the message names the file and what to do."""

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
    """A file the run must write cannot be written: the disk is full, read-only or not ours.
    The message names the path and what to do (free space, or another folder)."""

    label = "disk error"


# The OSErrors that are the machine's or the user's (a full or read-only disk, a file or folder
# without permission), not a bug: what each means in the one line, and what cures it.
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
    """What a full/read-only/forbidden disk error means in words, else None (another error)."""
    return DISK_REASONS.get(exc.errno, (None,))[0] if isinstance(exc, OSError) else None


def disk_error(exc: OSError, path: Any, what: str = "", keys: str = KEYS) -> DiskError:
    """The DiskError of an OSError while writing ``path``: ``"<path>: <reason>; [<what>: ]<what
    to do>"``; ``keys`` names the settings that move the folder."""
    reason, cure = DISK_REASONS.get(exc.errno, (exc.strerror or str(exc), WRITABLE))
    return DiskError(f"{path}: {reason}; {what + ': ' if what else ''}{cure.format(keys=keys)}")


def user_errors() -> list[type[UserError]]:
    """Every user-error class defined so far (subclasses elsewhere, e.g. the launchers'
    rendezvous error, included once their module is imported), most derived first."""
    out: list[type[UserError]] = []
    todo = [UserError]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.append(sub)
            todo.append(sub)
    return sorted(out, key=lambda c: -len(c.__mro__))


def error_line(exc: BaseException) -> str | None:
    """``"<label>: <message>"`` for a user error, else None (a bug keeps its traceback). An
    OSError of a full, read-only or forbidden disk that no caller named (from a library, or
    Hydra making the run dir) is a user error too: the line names its file when it is known."""
    if isinstance(exc, UserError):
        return f"{exc.label}: {exc}"
    if disk_reason(exc) is None:
        return None
    path = getattr(exc, "filename", None) or "a file of this run (unnamed; HYDRA_FULL_ERROR=1 " \
        "shows the traceback)"
    return f"{DiskError.label}: {disk_error(exc, path)}"  # type: ignore[arg-type]

