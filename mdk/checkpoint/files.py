"""Checkpoint files: atomic writes (mdk/atomic_file.py, durable: a kill or a full disk
leaves the old file or the new, never half of one) and reads that run no code and name the path
and the defect. Which files a stage has is mdk/checkpoint/layout.py's.

Every ``.pth`` is read with torch's safe unpickler (``weights_only=True``): tensors, numbers,
strings and containers only, so a file from elsewhere cannot run code. mdk's own checkpoints hold
nothing more; those written before 2026-11-28 also hold numpy's RNG state as an array, and the
few numpy types that rebuild one are allowed (``OLD_RNG_TYPES``), nothing else.
"""
from __future__ import annotations

import errno
import io
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mdk import faults
from mdk.atomic_file import replacing
from mdk.errors import CheckpointError, NonFiniteWeightsError

log = logging.getLogger(__name__)

ZIP_MAGIC = b"PK\x03\x04"      # torch.save's default (zip) format
PICKLE_MAGIC = b"\x80"          # legacy torch.save / plain pickle protocol >= 2
_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's array rebuilder (its module moved in 2.0)
# What numpy's legacy RNG state (an uint32 array) needs to unpickle, under both module names numpy
# has used; ``(obj, name)`` allows ``obj`` where a file names it ``name``.
OLD_RNG_TYPES = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), _RECONSTRUCT,
                 (_RECONSTRUCT, "numpy.core.multiarray._reconstruct"),
                 (_RECONSTRUCT, "numpy._core.multiarray._reconstruct")]
CONVERT = ("if you trust the file, keep only its tensors: python -c \"import torch; "
           "o = torch.load('IN', weights_only=False); torch.save(o.state_dict() if "
           "hasattr(o, 'state_dict') else o, 'OUT')\" (that load runs its code), then use OUT")


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def atomic_save(obj: Any, path: Path) -> None:
    """Write ``obj`` to ``path`` atomically and durably; CheckpointError on any OS error."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)  # serialise first: an OS error below is then always an OSError
    try:
        # faults: a kill between the write and the rename leaves only the temp file behind
        with replacing(path, binary=True, durable=True,
                       before_replace=lambda: faults.at("save")) as f:
            _write_all(f.fileno(), buf.getbuffer())
    except OSError as e:
        what = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
        prev = f"the previous {path.name} is intact" if path.is_file() else f"no {path.name} was written"
        raise CheckpointError(
            f"could not write checkpoint {path}: {what} ({type(e).__name__}: {e}); {prev}. Free "
            "space there or point paths.checkpoints at another disk, then run the same command "
            "again to resume") from e


def nonfinite_tensors(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, v in state.items()
            if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())]


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """atomic_save, but never replace a good file with a model that has NaN/Inf weights."""
    bad = nonfinite_tensors(state["model"])
    if bad:
        raise NonFiniteWeightsError(
            f"model weights became NaN/Inf by iteration {state.get('iter', '?')} (e.g. "
            f"{', '.join(bad[:3])}); not saving them, {Path(path)} keeps the last good state. "
            "Lower optim.lr, keep trainer.grad_clip on, or check the data")
    atomic_save(state, path)


def _diagnose(path: Path, exc: Exception) -> str:
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes): its write was interrupted"
    with open(path, "rb") as f:
        head = f.read(4)
    if head == ZIP_MAGIC:
        return (f"is truncated or damaged ({size} bytes; {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:120]})")
    if head[:1] == PICKLE_MAGIC:
        return f"is a damaged legacy pickle ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return f"is not a PyTorch checkpoint (it starts with {head!r}, {size} bytes)"


def _code_it_needs(path: Path) -> list[str]:
    """The Python objects a file's pickle would call or build beyond plain data (zip files)."""
    try:
        allowed = {f"{o.__module__}.{o.__name__}" for o in OLD_RNG_TYPES if not isinstance(o, tuple)}
        allowed |= {name for o in OLD_RNG_TYPES if isinstance(o, tuple) for name in o[1:]}
        return [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path)
                if g not in allowed]
    except Exception:  # a legacy (non-zip) file: torch cannot list them without loading
        return []


def read_pth(path: Path, advice: str = "move it away (or restore it) and run again") -> Any:
    """The object a ``.pth`` holds, read with torch's safe unpickler (no code runs);
    CheckpointError names the file and the defect: missing, empty, damaged, not a checkpoint, or
    a pickle that would run code (refused, with how to convert a file you trust)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with torch.serialization.safe_globals(OLD_RNG_TYPES):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise CheckpointError(f"checkpoint {path} {_diagnose(path, e)}; {advice}") from None
        needs = _code_it_needs(path)
        what = f"it would call or build {', '.join(needs[:3])}" if needs else \
            "it holds objects other than tensors, numbers, strings and containers"
        raise CheckpointError(
            f"checkpoint {path} was refused: {what}, and mdk reads checkpoints with torch's safe "
            f"unpickler (weights_only=True), which never runs code from a file; {CONVERT}"
        ) from None
    except Exception as e:  # truncated zip, pickle garbage, foreign format...
        raise CheckpointError(f"checkpoint {path} {_diagnose(path, e)}; {advice}") from None


def check_finite(state: dict[str, Any], path: Path, advice: str) -> None:
    bad = nonfinite_tensors(state)
    if bad:
        raise CheckpointError(f"checkpoint {path} holds NaN/Inf weights ({', '.join(bad[:3])}); "
                              f"{advice}")


def load_checkpoint(path: Path, advice: str = "move it away (or restore it) and run again"
                    ) -> dict[str, Any]:
    """Load an mdk checkpoint (a dict with a ``model`` entry); CheckpointError names the file and
    the defect. Weights from other tools: mdk/checkpoint/sources.py."""
    path = Path(path)
    obj = read_pth(path, advice)
    if not isinstance(obj, dict) or "model" not in obj:
        if isinstance(obj, dict) and obj and all(torch.is_tensor(v) for v in obj.values()):
            what = f"a bare state_dict ({len(obj)} tensors) without training state"
        else:
            what = f"a {type(obj).__name__} without a 'model' entry"
        raise CheckpointError(f"checkpoint {path} is not an mdk checkpoint ({what}); {advice}")
    check_finite(obj["model"], path, advice)
    return obj


def remove_stale_temps(stage_dir: Path) -> None:
    """Delete temp files of writes killed before their rename."""
    for p in sorted(Path(stage_dir).glob(".*.pth.*.tmp")):
        log.warning("removing %s: a checkpoint write was interrupted there; the previous file is "
                    "intact", p)
        p.unlink(missing_ok=True)


def load_model_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path,
                       strict: bool = True) -> None:
    """load_state_dict with a message naming the mismatching tensors instead of a raw traceback."""
    own = model.state_dict()
    missing = [k for k in own if k not in state] if strict else []
    unexpected = [k for k in state if k not in own] if strict else []
    shape = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
             for k in own if k in state and state[k].shape != own[k].shape]
    parts = [f"{len(v)} {what}: " + sep.join(v[:5]) for what, sep, v in (
        ("shape mismatch(es)", "; ", shape), ("missing", ", ", missing),
        ("unexpected", ", ", unexpected)) if v]
    if parts:
        raise CheckpointError(f"checkpoint {source} does not fit this model ({' | '.join(parts)}); "
                              "was it trained with another model= or dataset (class count)?")
    model.load_state_dict(state, strict=strict)
