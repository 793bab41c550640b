"""A folder written whole or not at all: made in a temp sibling, then renamed into place.

A writer holds a ``flock`` on a file in its ``.<name>.tmp-<random>`` folder while it writes. The
kernel drops the lock of a killed writer, so a leftover (lock free) can be told from a folder a
live process is writing, and only leftovers are removed.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

LOCK = ".writing"  # in a temp folder: locked while a live process writes it
YOUNG_S = 60.0  # a temp folder without its lock file yet (its first microseconds) is this young


def _alive(d: Path) -> bool:
    try:
        fd = os.open(d / LOCK, os.O_RDONLY)
    except FileNotFoundError:  # a trash folder (being deleted), or a temp folder just made
        return time.time() - d.stat().st_mtime < YOUNG_S
    except OSError:
        return True  # not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)


def remove_leftovers(target: Path, what: str) -> list[Path]:
    """Remove (and return) the temp folders that killed writers of ``target`` left."""
    removed = []
    for kind in ("tmp", "old") if target.parent.is_dir() else ():  # temp, then trash folders
        for d in sorted(target.parent.glob(f".{target.name}.{kind}-*")):
            if d.is_dir() and not _alive(d):
                log.warning("removing %s: writing %s was interrupted there (a killed run); it "
                            "is made again from the start", d, what)
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed


@contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A locked temp folder beside ``target`` to write into; the caller renames it into place
    (:func:`replace`) before the block ends; whatever is left is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    fd = os.open(tmp / LOCK, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel releases it when this process dies
        yield tmp
    finally:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)


def replace(tmp: Path, target: Path) -> None:
    """Rename the written ``tmp`` over ``target`` (an old ``target`` goes to a trash folder and
    is deleted); the lock file is not part of the result."""
    (tmp / LOCK).unlink(missing_ok=True)
    if target.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, trash / "data")
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, target)
