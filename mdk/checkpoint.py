"""Checkpoint files: atomic writes and loads that fail with a clear message.

A checkpoint is written to a temp file in the same directory, fsynced and renamed over the old
one, so a kill at any moment leaves either the previous complete file or the new one.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, foreign or does not fit the model."""


def atomic_save(obj: Any, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise CheckpointError(f"could not write checkpoint {path}: {e}. The previous file, if "
                                  "any, is intact; free disk space or point paths.checkpoints "
                                  "elsewhere") from e
        raise


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by mdk; raise CheckpointError naming the file on any defect."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated zip, pickle garbage, foreign format...
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); it is "
                              "truncated or not a torch checkpoint. Delete or move it and run "
                              "again") from e
    if not isinstance(obj, dict) or "model" not in obj:
        raise CheckpointError(f"checkpoint {path} is not an mdk checkpoint (no 'model' entry)")
    return obj


def load_model_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path,
                       strict: bool = True) -> None:
    """load_state_dict with a message naming the mismatching tensors instead of a raw traceback."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shape = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
             for k in own if k in state and state[k].shape != own[k].shape]
    if shape or (strict and (missing or unexpected)):
        parts = []
        if shape:
            parts.append("shape mismatch: " + "; ".join(shape[:5]))
        if missing and strict:
            parts.append("missing: " + ", ".join(missing[:5]))
        if unexpected and strict:
            parts.append("unexpected: " + ", ".join(unexpected[:5]))
        raise CheckpointError(f"checkpoint {source} does not fit this model ({' | '.join(parts)}); "
                              "was it trained with another model= or dataset (class count)?")
    model.load_state_dict(state, strict=strict)
