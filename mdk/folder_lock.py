"""One run per checkpoint folder: a flock on ``<paths.checkpoints>/.mdk.lock`` that names its
holder, held for the whole run (docs/pipeline.md, "One run per checkpoint folder"). On release the
text is emptied but the file stays (deleting it races with a process about to lock). Forked
children (DataLoader workers) close their copy at once, so a worker outliving its run never keeps
the folder locked.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from mdk.errors import CheckpointError

log = logging.getLogger(__name__)

LOCK_NAME = ".mdk.lock"
_held: set[int] = set()  # lock descriptors this process holds


def _close_in_child() -> None:
    # A forked child shares the parent's open file (and so its flock) until it closes its copy.
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _holder(text: str) -> tuple[str, str]:
    """The run a lock file's text names, in words, and where it logs ("" if unknown)."""
    try:
        h = json.loads(text)
        who = f"the run of pid {h['pid']} on host {h['host']} since {h['since']}"
        return who, h.get("run_dir", "")
    except (ValueError, KeyError, TypeError):
        return "another run", ""


def _holder_of(path: Path) -> tuple[str, str]:
    """Who holds ``path``; retried briefly, as a new holder may be writing it."""
    for _ in range(25):
        with contextlib.suppress(OSError):
            text = path.read_text().strip()
            if text:
                return _holder(text)
        time.sleep(0.02)
    return "another run", ""


@contextlib.contextmanager
def one_run(folder: Path, run_dir: str = "") -> Iterator[Path]:
    """Hold ``folder``'s lock for the ``with`` block, yielding its path; CheckpointError when
    another run holds it. ``run_dir``: where this run logs (named to a second run)."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise CheckpointError(f"cannot open the run lock {path} ({e.strerror}); remove what is "
                              "there, or give this run another paths.checkpoints") from None
    owner = os.getpid()  # a forked child that leaves the block must not touch the parent's lock
    try:
        if not _lock(fd, path, folder):
            yield path
            return
        left = path.read_text(errors="replace").strip()
        if left:
            log.warning("taking over %s: %s ended without releasing it (killed or crashed)", path,
                        _holder(left)[0])
        os.ftruncate(fd, 0)
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": time.strftime("%Y-%m-%d %H:%M:%S"), "run_dir": run_dir}
        os.pwrite(fd, json.dumps(me).encode() + b"\n", 0)
        _held.add(fd)
        try:
            yield path
        finally:
            if os.getpid() == owner:
                _held.discard(fd)
                os.ftruncate(fd, 0)  # released cleanly: nothing to take over
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        if os.getpid() == owner:
            os.close(fd)


def _lock(fd: int, path: Path, folder: Path) -> bool:
    """Take the lock (True), or find that this file system has none (False, warned)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        who, logs = _holder_of(path)
        where = f"its run dir: {logs}, its lock: {path}" if logs else f"its lock: {path}"
        raise CheckpointError(f"{folder} is in use by {who} ({where}); wait for it to end, or "
                              "give this run another paths.checkpoints") from None
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    log.warning("cannot lock %s: this file system has no working flock, so a second run on %s "
                "at the same time would not be stopped", path, folder)
    return False
