"""Standard records -> the ultralytics/YOLO layout that :class:`mdk.data.yolo.YOLOReader` reads
(``python -m mdk.tools.voc2yolo``): ``images/<key>/``, ``labels/<key>/<stem>.txt`` and a
``data.yaml`` whose ``names`` are the class list in order.

The export goes through the records, so it writes what mdk trains on (boxes as read and
clipped). Fractions are written exactly (the shortest text of the float64), so a box whose corners
are integers on an image of a power-of-two side reads back bit for bit. YOLO has no difficult
flag: a difficult object is written as an ordinary one (counted in the log).
"""
from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from typing import Optional, Sequence

import yaml

from mdk.atomic_file import write_text
from mdk.data.coco_export import place_image, voc_class_names
from mdk.data.records import Record
from mdk.data.voc import VOCReader
from mdk.errors import DataError

log = logging.getLogger(__name__)


def label_lines(rec: Record) -> str:
    """One ``class cx cy w h`` line per object, fractions of the image size."""
    lines = []
    for box, label in zip(rec.boxes.astype(float), rec.labels):
        x1, y1, x2, y2 = box
        fields = [(x1 + x2) / 2 / rec.width, (y1 + y2) / 2 / rec.height,
                  (x2 - x1) / rec.width, (y2 - y1) / rec.height]
        lines.append(" ".join([str(int(label))] + [repr(float(v)) for v in fields]))
    return "".join(line + "\n" for line in lines)


def write_yolo_split(records: Sequence[Record], images_root: Path, out_root: Path, key: str,
                     copy: bool = False) -> int:
    """Images (symlinked or copied from ``images_root / rec.image``) and label files of one split
    under ``out_root``; return how many difficult objects became ordinary ones."""
    images, labels = out_root / "images" / key, out_root / "labels" / key
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for rec in records:
        name = PurePosixPath(rec.image).name
        if name in seen:
            raise DataError(f"{images_root / rec.image}: a second image named {name!r} in split "
                            f"{key!r}; the YOLO layout keeps one folder per split, so rename one")
        seen.add(name)
        place_image((images_root / rec.image).resolve(), images / name, copy)
        write_text(labels / f"{PurePosixPath(name).stem}.txt", label_lines(rec))
    return int(sum(int(r.difficult.sum()) for r in records))


def write_data_yaml(out_root: Path, keys: Sequence[str], class_names: Sequence[str]) -> Path:
    """``data.yaml`` beside ``images/`` (no ``path:``: ultralytics then reads beside the yaml)."""
    doc = {key: f"images/{key}" for key in keys}
    doc["nc"] = len(class_names)
    doc["names"] = list(class_names)
    return write_text(out_root / "data.yaml", yaml.safe_dump(doc, sort_keys=False))


def export_voc_to_yolo(voc_root: str | Path, out_root: str | Path,
                       splits: Sequence[tuple[str, str]] = (("train", "train"), ("val", "val")),
                       class_names: Optional[Sequence[str]] = None, copy: bool = False) -> Path:
    """Write the YOLO layout of the VOC folder's ``splits`` (``(VOC split, yaml key)`` pairs) into
    ``out_root``; return the ``data.yaml``. ``class_names`` None: the names the annotations use,
    sorted."""
    voc_root, out_root = Path(voc_root).expanduser().resolve(), Path(out_root).expanduser()
    names = list(class_names) if class_names else voc_class_names(voc_root, [s for s, _ in splits])
    reader = VOCReader(voc_root, names)
    reader.check([s for s, _ in splits])
    for split, key in splits:
        got = reader.records(split)
        if got.clipped or got.zero_area:
            log.warning("%s split %r: %d boxes clipped to the image, %d of zero area (exported as "
                        "mdk reads them)", voc_root, split, got.clipped, got.zero_area)
        difficult = write_yolo_split(got.records, voc_root, out_root, key, copy)
        if difficult:
            log.warning("%s split %r: %d difficult objects written as ordinary ones (YOLO labels "
                        "have no difficult flag)", voc_root, split, difficult)
        log.info("wrote %s (%d images)", out_root / "labels" / key, len(got.records))
    return write_data_yaml(out_root, [key for _, key in splits], names)
