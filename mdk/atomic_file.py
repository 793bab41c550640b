"""Files written whole or not at all: the text goes to a temporary file beside the target, which
then replaces it in one rename. A kill, a full disk or an exception mid-write leaves the old file
(or none), never half a file; a reader sees one or the other. Checkpoints have their own, verified
writer (mdk/checkpoint.py).

The temporary name is unique per writer (``.<name>.<pid>.<random>.tmp``), so two processes
writing one file never share a temporary, and it is made with ``open(..., "x")``, so the file
gets the permissions of any new file (the umask's), not a private mode.
"""
from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator


@contextmanager
def replacing(path: str | Path, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """``with replacing(path) as f: f.write(...)``: ``path`` holds the text once the block ends
    without an exception, and is untouched otherwise (its parent folder is made if needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    try:
        with open(tmp, "x", encoding=encoding) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all; returns the path."""
    with replacing(path) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | Path, doc: Any, **dumps: Any) -> Path:
    """``json.dumps(doc, **dumps)`` and a newline, written whole or not at all."""
    return write_text(path, json.dumps(doc, **dumps) + "\n")
