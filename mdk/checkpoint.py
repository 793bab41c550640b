"""Checkpoint files: atomic writes (temp file, fsync, rename: a kill or full disk leaves the old
file or the new, never half of one) and loads that name the path and the defect. Which files a
stage has is mdk/stage_checkpoint.py's.

Checkpoints are trusted local files (``weights_only=False``: they hold RNG states and the config);
do not load files from untrusted sources.
"""
from __future__ import annotations

import errno
import io
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Optional

import torch

from mdk import faults
from mdk.errors import CheckpointError, NonFiniteWeightsError

log = logging.getLogger(__name__)

ZIP_MAGIC = b"PK\x03\x04"      # torch.save's default (zip) format
PICKLE_MAGIC = b"\x80"          # legacy torch.save / plain pickle protocol >= 2


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def atomic_save(obj: Any, path: Path) -> None:
    """Write ``obj`` to ``path`` atomically; CheckpointError on any OS error."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)  # serialise first: an OS error below is then always an OSError
    tmp: Optional[Path] = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's usual mode
        try:
            _write_all(fd, buf.getbuffer())
            os.fsync(fd)
        finally:
            os.close(fd)
        faults.at("save")  # test hook: a kill here leaves only the temp file behind
        os.replace(tmp, path)
        tmp = None
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)  # make the rename itself durable
        finally:
            os.close(dfd)
    except OSError as e:
        what = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
        prev = f"the previous {path.name} is intact" if path.is_file() else f"no {path.name} was written"
        raise CheckpointError(
            f"could not write checkpoint {path}: {what} ({type(e).__name__}: {e}); {prev}. Free "
            "space there or point paths.checkpoints at another disk, then run the same command "
            "again to resume") from e
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


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


def load_checkpoint(path: Path, advice: str = "move it away (or restore it) and run again"
                    ) -> dict[str, Any]:
    """Load an mdk checkpoint; CheckpointError names the file and the defect."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated zip, pickle garbage, foreign format...
        raise CheckpointError(f"checkpoint {path} {_diagnose(path, e)}; {advice}") from None
    if not isinstance(obj, dict) or "model" not in obj:
        if isinstance(obj, dict) and obj and all(torch.is_tensor(v) for v in obj.values()):
            what = f"a bare state_dict ({len(obj)} tensors) without training state"
        else:
            what = f"a {type(obj).__name__} without a 'model' entry"
        raise CheckpointError(f"checkpoint {path} is not an mdk checkpoint ({what}); {advice}")
    bad = nonfinite_tensors(obj["model"])
    if bad:
        raise CheckpointError(f"checkpoint {path} holds NaN/Inf weights ({', '.join(bad[:3])}); "
                              f"{advice}")
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
