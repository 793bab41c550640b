"""The user-error classes: a bad config, dataset, checkpoint or a run that cannot go on.

They live in the lowest module so any layer can raise them without importing a higher one; the
launcher turns each into one line on stderr (launchers/errors.py) instead of a traceback.
"""
from __future__ import annotations

import importlib
from typing import Any


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the key and what to do."""


class DataError(ValueError):
    """A dataset file is missing or wrong; the message names the file and what to do."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, foreign, not writable or does not fit the model."""


class NonFiniteWeightsError(CheckpointError):
    """Refused to save a model whose weights contain NaN/Inf (the previous file is kept)."""


class MissingStageInput(FileNotFoundError):
    """A stage's input checkpoint (the previous stage's best.pth) does not exist."""


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN/Inf; the run stops keeping the last good checkpoint."""


# Every class above is shown to the user as one line (launchers/errors.py names each kind); a
# loader worker's copy is unwrapped to its own message (mdk/data/loader.py); MDK_FAULT can raise
# each (mdk/faults.py).
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError,
                                            MissingStageInput, NonFiniteLossError)


def import_target(target: str, key: str, hint: str, error: type[Exception] = ConfigError) -> Any:
    """The object a config's dotted ``_target_`` names (a sink or dataset reader class). Not found:
    one ``error`` line naming ``key`` and the value, then ``hint`` (what to write instead)."""
    module, _, attr = str(target).rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise error(f"{key}={target!r} cannot be imported ({e}); {hint}") from None
