"""Bad images: every image of a split is decoded once, before any training, and the verdict cached
(docs/errors.md, "Bad images": why decoding, what keys the cache).

Up front, not on the fly: with ``dataset.on_bad_image=skip`` a bad image must leave the index
before the sampler draws the epoch, so the same seed gives the same, full global batches; with
``error`` it is one line from the main process instead of an error in a worker. JPEGs are decoded
in draft mode (1/8 DCT scaling): the whole stream is still read, at half the cost.
"""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional, Sequence

from PIL import Image

from mdk.atomic_file import write_json
from mdk.data.config import check_bad_image_policy
from mdk.errors import DataError
from mdk.progress import bars_on, progress_bar

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: [size, mtime_ns, ctime_ns, verdict] (1 had no ctime)
MISSING = "the file is missing"
# PIL's decoders release the GIL, so threads scale with cores; capped because the check is
# I/O-bound on network disks long before 8 cores are busy.
MAX_THREADS = 8
# What a corrupt or foreign file raises inside PIL (UnidentifiedImageError is an OSError).
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def decode_error(path: str | Path) -> Optional[str]:
    """None when ``path`` decodes, else why not (the file's own name is not repeated)."""
    try:
        with Image.open(path) as im:
            if im.format == "JPEG":
                im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
            im.load()
    except FileNotFoundError:
        return MISSING
    except Image.UnidentifiedImageError:
        return "not an image format PIL can read"
    except DECODE_ERRORS as exc:
        return str(exc) or type(exc).__name__
    return None


def _stamp(path: Path) -> Optional[list[int]]:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read_cache(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def check_images(root: str | Path, images: Sequence[str], cache_path: str | Path,
                 desc: str = "checking images", progress: Any = "auto") -> dict[str, str]:
    """Decode every image of ``images`` (paths relative to ``root``) the cache does not hold
    unchanged; return ``{relative path: reason}`` of the bad ones."""
    root, cache_path = Path(root), Path(cache_path)
    cached = _read_cache(cache_path)
    stamps = {rel: _stamp(root / rel) for rel in dict.fromkeys(images)}
    verdict: dict[str, Optional[str]] = {}
    todo = []
    for rel, stamp in stamps.items():
        hit = cached.get(rel)
        if stamp is not None and isinstance(hit, list) and len(hit) == 4 and hit[:3] == stamp:
            verdict[rel] = hit[3]
        else:
            todo.append(rel)
    if todo:
        if not bars_on(progress):
            log.info("%s: decoding %d image(s) once to find bad files (cached in %s)",
                     desc, len(todo), cache_path)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(MAX_THREADS, os.cpu_count() or 1)) as pool:
            results = pool.map(lambda rel: decode_error(root / rel), todo)
            bar = progress_bar(results, setting=progress, total=len(todo), desc=desc, unit="img")
            for rel, reason in zip(todo, bar):
                verdict[rel] = reason
        log.info("%s: %d image(s) decoded in %.1f s, %d bad", desc, len(todo),
                 time.perf_counter() - t0, sum(verdict[r] is not None for r in todo))
        files = {rel: [*stamps[rel], verdict[rel]] for rel in stamps if stamps[rel] is not None}
        try:
            write_json(cache_path, {"version": CACHE_VERSION, "files": files})
        except OSError as exc:  # a read-only cache folder costs a re-check next time, no more
            log.warning("could not write the image check cache %s (%s); the images will be "
                        "checked again next time", cache_path, exc)
    return {rel: reason for rel, reason in verdict.items() if reason is not None}


def apply_bad_image_policy(root: str | Path, split: str, bad: dict[str, str], policy: str,
                           total: int) -> set[str]:
    """``error``: raise DataError naming the first bad file. ``skip``: log every bad file once
    and return the relative paths to leave out."""
    check_bad_image_policy(policy)
    if not bad:
        return set()
    first, reason = next(iter(bad.items()))
    if policy == "error":  # one line: the first bad file and what to do
        others = list(bad)[1:]
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        more = (f" (and {len(others)} more bad image(s) in split {split!r}: {shown})"
                if others else "")
        if reason == MISSING:  # deleted after the index was built
            raise DataError(f"{Path(root) / first}: image listed in split {split!r} is missing"
                            f"{more}; restore it, remove its id from the split, or set "
                            "dataset.on_bad_image=skip")
        raise DataError(f"{Path(root) / first}: cannot decode image ({reason}){more}; replace the "
                        "file or set dataset.on_bad_image=skip")
    if len(bad) == total:
        raise DataError(f"{root}: none of the {total} images of split {split!r} can be decoded "
                        f"(first: {first}: {reason}); check the dataset folder")
    log.warning("%s split %r: skipping %d bad image(s) of %d (dataset.on_bad_image=skip): %s",
                root, split, len(bad), total,
                "; ".join(f"{rel} ({reason})" for rel, reason in bad.items()))
    return set(bad)
