"""Files written whole or not at all: a temporary beside the target (its name unique per writer),
then one rename, so a kill or a full disk mid-write leaves the old file (or none), never half a
file. The one implementation for every writer: checkpoints (mdk/checkpoint/files.py, durable:
synced to disk before and after the rename), JSON records, the caps, a dataset index, the chip
model's spec and the GTI hand-off texts.
"""
from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional


def temp_path(path: Path) -> Path:
    """The temporary a write of ``path`` goes through (unique per writer; ``.<name>.*.tmp``)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")


@contextmanager
def replacing(path: str | Path, binary: bool = False, durable: bool = False,
              before_replace: Optional[Callable[[], None]] = None) -> Iterator[IO[Any]]:
    """``path`` holds what the block wrote once it ends without an exception; untouched
    otherwise. ``durable``: the bytes and then the rename itself are synced to disk (a power cut
    after the block keeps the new file); ``before_replace`` runs between the write and the
    rename (a test hook)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        # "x": a fresh file with the umask's usual mode, never someone else's
        with open(tmp, "xb" if binary else "x", encoding=None if binary else "utf-8") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)  # make the rename itself durable
        finally:
            os.close(dfd)


def write_text(path: str | Path, text: str) -> Path:
    with replacing(path) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | Path, doc: Any, **dumps: Any) -> Path:
    return write_text(path, json.dumps(doc, **dumps) + "\n")
