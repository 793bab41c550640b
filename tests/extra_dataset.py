"""A dataset format mdk does not know, read by a class outside mdk (tests name it in
``dataset.reader._target_``): what a user's own format needs, one reader class and one YAML.

The format: one CSV file per split under the root, a row per object (an image without objects
is one row with empty box fields), images at paths relative to the root::

    image,width,height,x1,y1,x2,y2,class
    pics/a.jpg,64,64,3,4,20,30,circle
    pics/b.jpg,64,64,,,,,
"""
from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import Optional, Sequence

from mdk.data.records import Record, SplitRecords, clip_to_image, make_record, zero_area
from mdk.errors import DataError

FIELDS = ["image", "width", "height", "x1", "y1", "x2", "y2", "class"]


class CSVReader:
    """``table``: the CSV of a split, relative to the root; ``limit``: read only the first
    ``limit`` images of each split (a key of the reader's own, set in the YAML)."""

    def __init__(self, root: str | Path, class_names: Sequence[str], table: str = "{split}.csv",
                 limit: Optional[int] = None) -> None:
        self.root, self.class_names = Path(root), list(class_names)
        self.table, self.limit = table, limit

    def _file(self, split: str) -> Path:
        return self.root / self.table.format(split=split)

    def _rows(self, split: str) -> list[dict]:
        path = self._file(split)
        if not path.is_file():
            raise DataError(f"{path}: no such CSV file; write one per split")
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise DataError(f"{path}: split {split!r} has no rows; add one row per object")
        return rows

    def _images(self, split: str) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for row in self._rows(split):
            out.setdefault(row["image"], []).append(row)
        return dict(list(out.items())[:self.limit])

    def check(self, splits: Sequence[str]) -> None:
        for split in splits:
            self._rows(split)

    def count(self, split: str) -> int:
        return len(self._images(split))

    def sources(self, split: str) -> list[Path]:
        return [self._file(split)]

    def records(self, split: str) -> SplitRecords:
        out = SplitRecords([])
        for image, rows in self._images(split).items():
            if not (self.root / image).is_file():
                raise DataError(f"{self.root / image}: image listed in {self._file(split)} is missing")
            w, h = int(rows[0]["width"]), int(rows[0]["height"])
            boxes, labels = [], []
            for row in rows:
                if not row["x1"]:
                    continue
                box, changed = clip_to_image([float(row[k]) for k in ("x1", "y1", "x2", "y2")], w, h)
                if zero_area(box):  # this format leaves them out (the shipped readers keep them)
                    out.dropped += 1
                    continue
                out.clipped += changed
                boxes.append(box)
                labels.append(self.class_names.index(row["class"]))
            out.records.append(make_record(image, w, h, boxes, labels, [False] * len(labels)))
        return out


def write_csv_dataset(records: Sequence[Record], image_root: Path, out_root: Path, split: str,
                      class_names: Sequence[str]) -> list[str]:
    """Write ``records`` (images under ``image_root``) as this format: ``<out_root>/<split>.csv``
    and the images copied to ``<out_root>/pics/``; return the image paths in row order."""
    (out_root / "pics").mkdir(parents=True, exist_ok=True)
    images = []
    with open(out_root / f"{split}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        for rec in records:
            image = f"pics/{Path(rec.image).name}"
            shutil.copyfile(image_root / rec.image, out_root / image)
            images.append(image)
            rows = [[*(f"{v:g}" for v in box), class_names[int(label)]]
                    for box, label in zip(rec.boxes, rec.labels)] or [["", "", "", "", ""]]
            writer.writerows([image, rec.width, rec.height, *row] for row in rows)
    return images
