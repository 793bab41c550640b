"""Standard records -> a COCO instances JSON; a VOC folder -> the COCO layout that
:class:`mdk.data.coco.COCOReader` reads by default (``python -m mdk.tools.voc2coco``).

The export goes through the records, so it writes what mdk trains on (boxes as read and clipped,
VOC difficult as ``iscrowd=1``); reading it back with ``dataset=coco`` gives the same records,
bit for bit, in the same order.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Optional, Sequence

from mdk.atomic_file import write_json
from mdk.data.records import Record
from mdk.data.voc import VOCReader, split_class_names

log = logging.getLogger(__name__)


def _plain(v: float) -> int | float:
    """A JSON number as short as it is exact (integral pixels stay integers)."""
    v = float(v)
    return int(v) if v.is_integer() else v


def records_to_coco(records: Sequence[Record], class_names: Sequence[str]) -> dict:
    """A COCO instances document of ``records``: ``file_name`` without its folder (the reader's
    ``images`` key), ids from 1 in record order, category ids from 1 in ``class_names`` order."""
    images, annotations = [], []
    for n, rec in enumerate(records, start=1):
        images.append({"id": n, "file_name": PurePosixPath(rec.image).name,
                       "width": int(rec.width), "height": int(rec.height)})
        for box, label, difficult in zip(rec.boxes, rec.labels, rec.difficult):
            x1, y1, x2, y2 = (float(v) for v in box)
            w, h = x2 - x1, y2 - y1   # exact in float64 for float32 corners: x1 + w == x2
            annotations.append({"id": len(annotations) + 1, "image_id": n,
                                "category_id": int(label) + 1,
                                "bbox": [_plain(x1), _plain(y1), _plain(w), _plain(h)],
                                "area": _plain(w * h), "iscrowd": int(bool(difficult))})
    categories = [{"id": i + 1, "name": name, "supercategory": "none"}
                  for i, name in enumerate(class_names)]
    return {"info": {"description": "exported by mdk"}, "images": images,
            "annotations": annotations, "categories": categories}


def voc_class_names(voc_root: str | Path, splits: Sequence[str]) -> list[str]:
    """The object names used in the annotations of ``splits``, sorted (a file that does not
    parse is skipped here; reading it for the export then names it)."""
    names: set[str] = set()
    for split in splits:
        names.update(split_class_names(voc_root, split))
    return sorted(names)


def place_image(src: Path, dst: Path, copy: bool) -> None:
    """An exported folder's image: a symlink to ``src`` (kept if it already points there) or a
    copy."""
    if dst.is_symlink() or dst.exists():
        if not copy and dst.is_symlink() and os.readlink(dst) == str(src):
            return
        dst.unlink()
    if copy:
        shutil.copy2(src, dst)
    else:
        dst.symlink_to(src)


def export_voc_to_coco(voc_root: str | Path, out_root: str | Path,
                       splits: Sequence[str] = ("train", "val"),
                       class_names: Optional[Sequence[str]] = None,
                       copy: bool = False) -> list[Path]:
    """Write ``<out_root>/annotations/instances_<split>.json`` and ``<out_root>/<split>/``
    (symlinks to the VOC images, or copies with ``copy``) for each split; return the JSON paths.
    ``class_names`` None: the names the annotations use, sorted (read back by name, so the order
    does not change the labels)."""
    voc_root, out_root = Path(voc_root).expanduser().resolve(), Path(out_root).expanduser()
    names = list(class_names) if class_names else voc_class_names(voc_root, splits)
    reader = VOCReader(voc_root, names)
    reader.check(splits)
    written = []
    for split in splits:
        got = reader.records(split)
        if got.clipped or got.zero_area:
            log.warning("%s split %r: %d boxes clipped to the image, %d of zero area (exported as "
                        "mdk reads them)", voc_root, split, got.clipped, got.zero_area)
        folder = out_root / split
        folder.mkdir(parents=True, exist_ok=True)
        for rec in got.records:
            place_image(voc_root / rec.image, folder / PurePosixPath(rec.image).name, copy)
        path = out_root / "annotations" / f"instances_{split}.json"
        write_json(path, records_to_coco(got.records, names))  # never half a file
        log.info("wrote %s (%d images)", path, len(got.records))
        written.append(path)
    return written
