"""The user-error classes: a bad config, dataset, checkpoint or a run that cannot go on.

Each carries its ``label``, the words the user sees before its message (``config error: ...``):
a user error is one line on stderr, not a traceback, from whichever process raised it (the
parent, a rank or a loader worker). They live in the lowest module so any layer can raise them
without importing a higher one. A new kind is a subclass of ``UserError`` with a label; every
list of kinds (the one-line printer, the loader's unwrap, fault injection) is ``user_errors()``.
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar


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
    """``"<label>: <message>"`` for a user error, else None (a bug keeps its traceback)."""
    return f"{exc.label}: {exc}" if isinstance(exc, UserError) else None


def import_target(target: str, key: str, hint: str, error: type[Exception] = ConfigError) -> Any:
    """The object a config's dotted ``_target_`` names (a sink or dataset reader class). Not found:
    one ``error`` line naming ``key`` and the value, then ``hint`` (what to write instead)."""
    module, _, attr = str(target).rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise error(f"{key}={target!r} cannot be imported ({e}); {hint}") from None
