"""The dataset index: VOC annotations of one split -> one meta txt file (the seed MDK's
``tools/xml_2_txt.py`` step), and reading it back. ``python -m mdk.tools.xml2txt`` is its
command-line front end.

Meta file format (v1). The first line is a header, ``# mdk-meta {json}``, recording the root,
split, class list and how many boxes were clipped/dropped (see :mod:`mdk.data.voc` for that
policy), so staleness can be checked and the counts reported whenever the file is used. Then one
line per image, space separated::

    relative/image/path width height x1 y1 x2 y2 cls difficult x1 y1 x2 y2 cls difficult ...

The seed's lines are ``path x1 y1 x2 y2 cls ...``; we add the original image size (to rescale
boxes without opening the image) and the VOC ``difficult`` flag (evaluation ignores those objects).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from mdk.data.voc import DataError, check_root, find_image, parse_voc_xml, read_split, split_file

log = logging.getLogger(__name__)

HEADER = "# mdk-meta "
VERSION = 1


@dataclass
class MetaEntry:
    image: str            # path relative to the dataset root
    width: int
    height: int
    boxes: np.ndarray     # [N, 4] float32 xyxy in original image pixels
    labels: np.ndarray    # [N] int64
    difficult: np.ndarray  # [N] bool


def _header(root: Path, split: str, class_names: Sequence[str], clipped: int = 0,
            dropped: int = 0) -> dict:
    return {"version": VERSION, "root": str(root), "split": split,
            "classes": list(class_names), "clipped": clipped, "dropped": dropped}


def build_meta(root: str | Path, split: str, class_names: Sequence[str], out_path: str | Path) -> Path:
    """Parse every annotation of ``split`` and write the meta file atomically; return its path."""
    root = check_root(root).resolve()
    out_path = Path(out_path)
    split_path = split_file(root, split)
    lines: list[str] = []
    clipped = dropped = 0
    for image_id in read_split(root, split):
        image = find_image(root, image_id, split_path)
        rec = parse_voc_xml(root / "Annotations" / f"{image_id}.xml", class_names)
        for note in rec.notes:
            log.debug("%s: %s", rec.path, note)
        clipped, dropped = clipped + rec.clipped, dropped + rec.dropped
        rel = image.relative_to(root).as_posix()
        if any(ch.isspace() for ch in rel):
            raise DataError(f"{image}: image path contains whitespace, which the meta format "
                            "cannot hold; rename the image and its split entry")
        fields = [rel, str(rec.width), str(rec.height)]
        for box, label, diff in zip(rec.boxes, rec.labels, rec.difficult):
            fields += [f"{v:g}" for v in box] + [str(int(label)), str(int(diff))]
        lines.append(" ".join(fields))
    if clipped or dropped:
        log.warning("%s split %r: %d boxes clipped to the image, %d zero-area boxes dropped "
                    "(run with DEBUG logging to see each)", root, split, clipped, dropped)
    header = HEADER + json.dumps(_header(root, split, class_names, clipped, dropped))
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


def is_stale(root: str | Path, split: str, class_names: Sequence[str], meta_path: str | Path) -> bool:
    """True when the meta file is missing, was made for another root/split/class list, or is
    older than the split list or any of its annotation files."""
    root, meta_path = Path(root).resolve(), Path(meta_path)
    header = read_header(meta_path)
    if header is None:
        return True
    want = _header(root, split, class_names)
    if any(header.get(k) != want[k] for k in ("version", "root", "split", "classes")):
        return True
    made = meta_path.stat().st_mtime
    if split_file(root, split).stat().st_mtime > made:
        return True
    for image_id in read_split(root, split):
        xml = root / "Annotations" / f"{image_id}.xml"
        if not xml.exists() or xml.stat().st_mtime > made:
            return True
    return False


def ensure_meta(root: str | Path, split: str, class_names: Sequence[str], out_path: str | Path) -> Path:
    """Return ``out_path``, (re)building it first when :func:`is_stale`."""
    check_root(root)
    if is_stale(root, split, class_names, out_path):
        return build_meta(root, split, class_names, out_path)
    return Path(out_path)


def read_meta(path: str | Path) -> tuple[dict, list[MetaEntry]]:
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
        entries.append(MetaEntry(parts[0], int(parts[1]), int(parts[2]),
                                 objs[:, :4].astype(np.float32), objs[:, 4].astype(np.int64),
                                 objs[:, 5].astype(bool)))
    return header, entries
