"""Files written whole or not at all: a temporary beside the target (its name unique per writer),
then one rename, so a kill or a full disk mid-write leaves the old file (or none), never half a
file. Checkpoints have their own verified writer (mdk/checkpoint.py).
"""
from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator


@contextmanager
def replacing(path: str | Path) -> Iterator[IO[str]]:
    """``path`` holds the text once the block ends without an exception; untouched otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    with replacing(path) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | Path, doc: Any, **dumps: Any) -> Path:
    return write_text(path, json.dumps(doc, **dumps) + "\n")
