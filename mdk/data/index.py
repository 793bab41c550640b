"""The dataset index: one split's records, for any reader, cached in one meta txt file (the seed
MDK's ``tools/xml_2_txt.py`` step; ``python -m mdk.tools.xml2txt``), and reading it back.

Meta file format (v2; an older file is rebuilt): a header line ``# mdk-meta {json}`` (root,
split, class list, reader class, the sources' ``content`` key, the bad-box counts), then one line
per image (its size rescales boxes without opening the image)::

    relative/image/path width height x1 y1 x2 y2 cls difficult x1 y1 x2 y2 cls difficult ...

The key hashes the sources' names, sizes and bytes, not their time stamps (README.md, "Extending
mdk"): reading the bytes is cheap next to parsing them. The images are not part of it
(:mod:`mdk.data.image_check` has its own).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from mdk.atomic_file import write_text
from mdk.data.records import Reader, Record
from mdk.errors import DataError

log = logging.getLogger(__name__)

HEADER = "# mdk-meta "
VERSION = 2
# Header keys that must match for the file to describe what the reader would read now.
KEY = ("version", "root", "split", "classes", "reader", "content")
CHUNK = 1 << 20  # a large source (a COCO JSON of 450 MB) is hashed in pieces, not read whole


def content_key(root: str | Path, sources: Sequence[Path]) -> str:
    """A hash of each source's name (relative to ``root``), size and bytes, in the reader's order;
    a missing file counts as its own state (the rebuild then names it)."""
    h = hashlib.sha1()
    prefix = str(root).rstrip(os.sep) + os.sep
    for p in sources:
        name = str(p)  # relative to the root; relpath() for every file costs 0.1 s per 16k
        h.update((name[len(prefix):] if name.startswith(prefix) else
                  os.path.relpath(p, root)).encode() + b"\0")
        try:
            with open(p, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                h.update(f"{size}\0".encode())
                while size > 0:  # an annotation: one read; a large JSON: in pieces
                    chunk = f.read(min(size, CHUNK))
                    if not chunk:
                        break
                    h.update(chunk)
                    size -= len(chunk)
        except OSError as e:
            h.update(f"unreadable {e.errno}\0".encode())
    return "sha1:" + h.hexdigest()


def _header(reader: Reader, split: str, sources: Sequence[Path]) -> dict:
    root = Path(reader.root).expanduser().resolve()
    kind = type(reader)
    return {"version": VERSION, "root": str(root), "split": split,
            "classes": list(reader.class_names), "reader": f"{kind.__module__}.{kind.__qualname__}",
            "content": content_key(reader.root, sources)}


def meta_text(reader: Reader, split: str) -> str:
    """Read every record of ``split``: the text of its meta file (header line, one per image)."""
    # Keyed before reading: a file changed while it is read makes the next check rebuild again.
    header = _header(reader, split, reader.sources(split))
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
    counts = {"clipped": got.clipped, "dropped": got.dropped, "zero_area": got.zero_area}
    if any(counts.values()):
        log.warning("%s split %r: %s (run with DEBUG logging to see each)", root, split,
                    box_counts(counts))
    header = HEADER + json.dumps({**header, **counts})
    return header + "\n" + "\n".join(lines) + "\n"


def build_meta(reader: Reader, split: str, out_path: str | Path) -> Path:
    """Read every record of ``split`` and write the meta file atomically; return its path."""
    text = meta_text(reader, split)
    out_path = write_text(out_path, text)
    log.info("wrote %s (%d images)", out_path, text.count("\n") - 1)
    return out_path


def read_header(path: str | Path) -> dict | None:
    try:
        with open(path) as f:
            first = f.readline()
        return json.loads(first[len(HEADER):]) if first.startswith(HEADER) else None
    except (OSError, ValueError):
        return None


def is_stale(reader: Reader, split: str, meta_path: str | Path) -> bool:
    """The one staleness rule: the meta file is missing, or its header's ``KEY`` fields differ
    from now."""
    header = read_header(meta_path)
    if header is None:
        return True
    want = _header(reader, split, reader.sources(split))
    return any(header.get(k) != want[k] for k in KEY)


def ensure_meta(reader: Reader, split: str, out_path: str | Path) -> Path:
    """Return ``out_path``, (re)building it first when :func:`is_stale`."""
    stale = is_stale(reader, split, out_path)
    return build_meta(reader, split, out_path) if stale else Path(out_path)


def fresh_count(reader: Reader, split: str, meta_path: str | Path) -> Optional[int]:
    """How many images the cache of ``split`` holds when it is fresh, else None (a pre-flight
    count without parsing the annotations again)."""
    if is_stale(reader, split, meta_path):
        return None
    with open(meta_path) as f:
        return sum(1 for line in f if line.strip()) - 1   # less the header


def cached_records(reader: Reader, split: str, meta_dir: str | Path) -> list[Record]:
    """The records of ``split`` through the cache ``<meta_dir>/<split>.txt`` (built when stale);
    the bad-box counts are reported each time. A cache that cannot be written costs a warning and
    a rebuild next time, not the run."""
    path = Path(meta_dir) / f"{split}.txt"
    if not is_stale(reader, split, path):
        header, records = read_meta(path)
    else:
        text = meta_text(reader, split)
        try:
            write_text(path, text)
            log.info("wrote %s (%d images)", path, text.count("\n") - 1)
        except OSError as e:
            log.warning("could not write the dataset index %s (%s); the annotations are read "
                        "again next time", path, e.strerror or e)
        header, records = parse_meta(text, path)
    if any(header.get(k) for k in ("clipped", "dropped", "zero_area")):
        log.warning("%s split %r, reading the annotations: %s", header.get("root"), split,
                    box_counts(header))
    return records


def box_counts(counts: dict) -> str:
    """What the bad-box policy did to a split, in words."""
    parts = [f"{counts.get('clipped', 0)} boxes clipped to the image"]
    if counts.get("zero_area"):
        parts.append(f"{counts['zero_area']} zero-area boxes kept for evaluation only (the VOC "
                     "devkit counts them: no detection can match one; training leaves them out)")
    if counts.get("dropped"):
        parts.append(f"{counts['dropped']} boxes dropped by the reader")
    return ", ".join(parts)


def read_meta(path: str | Path) -> tuple[dict, list[Record]]:
    """Parse a meta file written by :func:`build_meta` -> (header, entries)."""
    try:
        text = Path(path).read_text()
    except OSError:
        text = ""
    return parse_meta(text, path)


def parse_meta(text: str, path: str | Path) -> tuple[dict, list[Record]]:
    """Parse the text of a meta file (``path`` names it in errors) -> (header, entries)."""
    first, _, body = text.partition("\n")
    try:
        header = json.loads(first[len(HEADER):]) if first.startswith(HEADER) else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("version") != VERSION:
        raise DataError(f"{path}: not an mdk meta file (v{VERSION}); rebuild it with "
                        "python -m mdk.tools.xml2txt")
    entries = []
    for n, line in enumerate(body.splitlines(), start=2):
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
