"""The dataset index: a cache of one split's standard records (:mod:`mdk.data.records`), for
any reader, in one meta txt file (the seed MDK's ``tools/xml_2_txt.py`` step), and reading it back.
``python -m mdk.tools.xml2txt`` is its command-line front end for VOC folders.

Meta file format (v1). The first line is a header, ``# mdk-meta {json}``, recording the root,
split, class list, reader class, a digest of the reader's source file list and how many boxes
were clipped/dropped (see :func:`mdk.data.records.clip_to_image` for that policy), so staleness
can be checked and the counts reported whenever the file is used. Then one line per image, space
separated::

    relative/image/path width height x1 y1 x2 y2 cls difficult x1 y1 x2 y2 cls difficult ...

The seed's lines are ``path x1 y1 x2 y2 cls ...``; we add the original image size (to rescale
boxes without opening the image) and the ``difficult`` flag (evaluation ignores those objects).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from mdk.data.records import Reader, Record
from mdk.errors import DataError

log = logging.getLogger(__name__)

HEADER = "# mdk-meta "
VERSION = 1
# Header keys that must match for the file to describe what the reader would read now.
KEY = ("version", "root", "split", "classes", "reader", "sources")


def _header(reader: Reader, split: str, sources: Sequence[Path], clipped: int = 0,
            dropped: int = 0) -> dict:
    root = Path(reader.root).expanduser().resolve()
    # The source list, not only its files' times: another annotation file named by a reader key
    # may be older than the cache and must still rebuild it.
    listing = "\n".join(os.path.relpath(p, reader.root) for p in sources).encode()
    kind = type(reader)
    return {"version": VERSION, "root": str(root), "split": split,
            "classes": list(reader.class_names), "reader": f"{kind.__module__}.{kind.__qualname__}",
            "sources": hashlib.sha1(listing).hexdigest()[:16], "clipped": clipped,
            "dropped": dropped}


def build_meta(reader: Reader, split: str, out_path: str | Path) -> Path:
    """Read every record of ``split`` and write the meta file atomically; return its path."""
    out_path = Path(out_path)
    sources = reader.sources(split)
    got = reader.records(split)
    root = Path(reader.root).expanduser().resolve()
    lines: list[str] = []
    for rec in got.records:
        if any(ch.isspace() for ch in rec.image):
            raise DataError(f"{root / rec.image}: image path contains whitespace, which the meta "
                            "format cannot hold; rename the image and its split entry")
        fields = [rec.image, str(rec.width), str(rec.height)]
        for box, label, diff in zip(rec.boxes, rec.labels, rec.difficult):
            fields += [f"{v:g}" for v in box] + [str(int(label)), str(int(diff))]
        lines.append(" ".join(fields))
    if got.clipped or got.dropped:
        log.warning("%s split %r: %d boxes clipped to the image, %d zero-area boxes dropped "
                    "(run with DEBUG logging to see each)", root, split, got.clipped, got.dropped)
    header = HEADER + json.dumps(_header(reader, split, sources, got.clipped, got.dropped))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", dir=out_path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(header + "\n" + "\n".join(lines) + "\n")
        os.replace(tmp, out_path)   # a kill never leaves a half-written meta file
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("wrote %s (%d images)", out_path, len(lines))
    return out_path


def read_header(path: str | Path) -> dict | None:
    try:
        with open(path) as f:
            first = f.readline()
        return json.loads(first[len(HEADER):]) if first.startswith(HEADER) else None
    except (OSError, ValueError):
        return None


def is_stale(reader: Reader, split: str, meta_path: str | Path) -> bool:
    """True when the meta file is missing, was made for another root/split/class list/reader or
    source list, or is older than any of the reader's source files (the one staleness rule)."""
    meta_path = Path(meta_path)
    header = read_header(meta_path)
    if header is None:
        return True
    sources = reader.sources(split)
    want = _header(reader, split, sources)
    if any(header.get(k) != want[k] for k in KEY):
        return True
    made = meta_path.stat().st_mtime
    return any(not Path(p).exists() or Path(p).stat().st_mtime > made for p in sources)


def ensure_meta(reader: Reader, split: str, out_path: str | Path) -> Path:
    """Return ``out_path``, (re)building it first when :func:`is_stale`."""
    if is_stale(reader, split, out_path):
        return build_meta(reader, split, out_path)
    return Path(out_path)


def fresh_count(reader: Reader, split: str, meta_path: str | Path) -> Optional[int]:
    """How many images the cache of ``split`` holds when it is fresh, else None: a pre-flight
    count without reading the annotations again (a large COCO JSON takes seconds to parse)."""
    if is_stale(reader, split, meta_path):
        return None
    with open(meta_path) as f:
        return sum(1 for line in f if line.strip()) - 1   # less the header


def cached_records(reader: Reader, split: str, meta_dir: str | Path) -> list[Record]:
    """The records of ``split`` through the cache ``<meta_dir>/<split>.txt`` (built when stale);
    the boxes clipped/dropped while reading them are reported each time (they are data loss)."""
    header, records = read_meta(ensure_meta(reader, split, Path(meta_dir) / f"{split}.txt"))
    if header.get("clipped") or header.get("dropped"):
        log.warning("%s split %r: %d boxes were clipped to the image and %d zero-area boxes "
                    "dropped when reading the annotations", header.get("root"), split,
                    header.get("clipped", 0), header.get("dropped", 0))
    return records


def read_meta(path: str | Path) -> tuple[dict, list[Record]]:
    """Parse a meta file written by :func:`build_meta` -> (header, entries)."""
    path = Path(path)
    header = read_header(path)
    if header is None or header.get("version") != VERSION:
        raise DataError(f"{path}: not an mdk meta file (v{VERSION}); rebuild it with "
                        "python -m mdk.tools.xml2txt")
    entries = []
    for n, line in enumerate(path.read_text().splitlines()[1:], start=2):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 3 or (len(parts) - 3) % 6:
            raise DataError(f"{path}:{n}: expected 'path width height' then 6 numbers per box, "
                            f"got {len(parts)} fields; rebuild it with python -m mdk.tools.xml2txt")
        objs = np.asarray(parts[3:], dtype=np.float64).reshape(-1, 6)
        entries.append(Record(parts[0], int(parts[1]), int(parts[2]),
                              objs[:, :4].astype(np.float32), objs[:, 4].astype(np.int64),
                              objs[:, 5].astype(bool)))
    return header, entries
