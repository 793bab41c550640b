"""The ultralytics/YOLO layout: :class:`YOLOReader`, the reader of ``dataset=yolo`` (its layout and
rules: conf/dataset/yolo.yaml; the ``data.yaml``: :mod:`mdk.data.yolo_yaml`).

A split's images are the image files of its folders (recursively) and the lines of its .txt
lists, sorted by path as ultralytics sorts them. Each image's labels are in the file its path
names with the last ``/images/`` turned into ``/labels/`` and the extension into ``.txt``; no such
file (or an empty one) is a background image. A label line is ``class cx cy w h``, normalised to
0-1, or ``class x1 y1 x2 y2 ...`` (a segmentation polygon, read as its box). Boxes follow the
bad-box policy of :mod:`mdk.data.records`; anything else wrong is one line naming file:line.
The image size (labels are fractions of it) is read from the image file's header.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional, Sequence

from PIL import Image

from mdk.data.image_check import DECODE_ERRORS
from mdk.data.records import SplitRecords, fix_box, make_record
from mdk.data.yolo_yaml import class_names_of, find_yaml, load_yaml, split_sources
from mdk.errors import DataError

log = logging.getLogger(__name__)

# Image files a split folder holds (what PIL decodes of ultralytics' list); others are ignored.
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp")
# Exporters write 1.0000001 for a border: a fraction this far past 0-1 is a rounding, not an error.
SLACK = 1e-6
LINE_FORMS = ("'class cx cy w h' (5 numbers, normalised to 0-1) or 'class x1 y1 x2 y2 x3 y3 ...' "
              "(a polygon of 3 or more points)")


def label_path(image: str) -> str:
    """The label file of ``image`` (an absolute path): the last ``/images/`` -> ``/labels/``,
    the extension -> ``.txt`` (ultralytics' rule)."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    head, sep, tail = image.rpartition(sa)
    path = head + sb + tail if sep else image
    return os.path.splitext(path)[0] + ".txt"


def _folder_images(folder: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames.sort()
        out += [os.path.join(dirpath, f) for f in filenames if f.lower().endswith(IMAGE_SUFFIXES)]
    return out


def _listed_images(listing: Path) -> list[str]:
    """The images of a .txt list, one per line, relative lines to the list's folder."""
    try:
        lines = listing.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{listing}: cannot read the image list ({exc}); fix the file") from None
    out = []
    for n, line in enumerate(lines, start=1):
        entry = line.strip()
        if not entry:
            continue
        image = os.path.normpath(os.path.join(listing.parent, entry))
        if not os.path.isfile(image):
            raise DataError(f"{listing}:{n}: lists {entry!r}, which is not a file ({image}); add "
                            "the image or remove the line")
        out.append(image)
    return out


def _numbers(parts: list[str], where: str) -> list[float]:
    try:
        return [float(v) for v in parts]
    except ValueError:
        bad = next(v for v in parts if not _is_number(v))
        raise DataError(f"{where}: {bad!r} is not a number; a label line is {LINE_FORMS}"
                        ) from None


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


class YOLOReader:
    """ultralytics/YOLO layout. ``root``: the folder holding ``data.yaml`` (or the yaml itself);
    splits are keys of the yaml (``train``, ``val``, ``test``). ``class_names`` None: the yaml's
    names; else the yaml's ids are matched to them by name."""

    def __init__(self, root: str | Path, class_names: Optional[Sequence[str]] = None) -> None:
        self.root = Path(root).expanduser()
        self._doc: Optional[dict] = None
        self._names: Optional[list[str]] = None
        self.class_names = list(class_names) if class_names else []
        self._images: dict[str, tuple[list[Path], list[str]]] = {}

    @property
    def yaml_path(self) -> Path:
        return find_yaml(self.root).resolve()

    def yaml_names(self) -> list[str]:
        """The class names the yaml gives, in id order."""
        if self._names is None:
            path = self.yaml_path
            self._doc = load_yaml(path)
            self._names = class_names_of(self._doc, path)
        return list(self._names)

    def data_class_names(self, train_split: str, val_split: str) -> list[str]:
        """data.yaml's names (every split's labels use its ids)."""
        return self.yaml_names()

    def _split(self, split: str) -> tuple[list[Path], list[str]]:
        """(the split's folders and lists, its images: absolute paths, sorted)."""
        if split not in self._images:
            names = self.yaml_names()
            if not self.class_names:
                self.class_names = names
            path = self.yaml_path
            sources = split_sources(self._doc or {}, path, split)
            images: list[str] = []
            for where in sources:
                images += _folder_images(where) if where.is_dir() else _listed_images(where)
            if not images:
                raise DataError(f"{path}: split {split!r} ({', '.join(map(str, sources))}) holds "
                                f"no images ({', '.join(IMAGE_SUFFIXES)}); fix {split}: or add "
                                "the images")
            self._images[split] = (sources, sorted(images))
        return self._images[split]

    def check(self, splits: Sequence[str]) -> None:
        for split in splits:
            self._split(split)

    def count(self, split: str) -> int:
        return len(self._split(split)[1])

    def sources(self, split: str) -> list[Path]:
        """The yaml, the split's lists, and each image's label file (a missing one counts as
        its own state: a background image, or a new image, changes the key)."""
        where, images = self._split(split)
        return ([self.yaml_path] + [p for p in where if p.is_file()]
                + [Path(label_path(im)) for im in images])

    def _label_index(self) -> list[int]:
        """The yaml's class id -> the index in ``class_names`` (-1: not in it)."""
        index = {name: i for i, name in enumerate(self.class_names)}
        return [index.get(name, -1) for name in self.yaml_names()]

    def records(self, split: str) -> SplitRecords:
        _, images = self._split(split)
        root = self.root.resolve()
        inside = str(root) + os.sep if root.is_dir() else None
        to_label, names = self._label_index(), self.yaml_names()
        out, polygons = SplitRecords([]), 0
        for image in images:
            try:
                with Image.open(image) as im:
                    width, height = im.size
            except DECODE_ERRORS as exc:
                raise DataError(f"{image}: cannot read the image's size ({exc}); replace the "
                                "file, or remove it and its label file from the split") from None
            boxes, labels, n_poly = self._read_labels(label_path(image), width, height, to_label,
                                                      names, out)
            polygons += n_poly
            rel = image[len(inside):] if inside and image.startswith(inside) else image
            out.records.append(make_record(Path(rel).as_posix(), width, height, boxes, labels,
                                           [False] * len(labels)))
        if polygons:
            log.warning("%s split %r: %d label lines are segmentation polygons; each is read as "
                        "its bounding box", self.root, split, polygons)
        return out

    def _read_labels(self, path: str, width: int, height: int, to_label: list[int],
                     names: list[str], got: SplitRecords) -> tuple[list, list, int]:
        """(boxes in pixels, labels, polygon lines) of one label file; none when it is missing."""
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            return [], [], 0
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{path}: cannot read the label file ({exc}); fix or remove it"
                            ) from None
        boxes, labels, polygons = [], [], 0
        for n, line in enumerate(text.splitlines(), start=1):
            parts = line.split()
            if not parts:
                continue
            where = f"{path}:{n}"
            if len(parts) != 5 and (len(parts) < 7 or len(parts) % 2 == 0):
                raise DataError(f"{where}: {len(parts)} fields; a label line is {LINE_FORMS}")
            values = _numbers(parts, where)
            cls = values[0]
            if not cls.is_integer() or not 0 <= cls < len(names):
                raise DataError(f"{where}: class id {parts[0]!r} is not one of data.yaml's ids "
                                f"0..{len(names) - 1} ({self.yaml_path}); fix the label or add "
                                "the class to names:")
            label = to_label[int(cls)]
            if label < 0:
                raise DataError(f"{where}: class id {int(cls)} is {names[int(cls)]!r} in "
                                f"data.yaml, not in dataset.class_names {self.class_names}; add "
                                "it to the class list or fix the label")
            coords = values[1:]
            bad = next((v for v in coords if not -SLACK <= v <= 1 + SLACK), None)
            if bad is not None:
                raise DataError(f"{where}: coordinate {bad:g} is outside 0-1; YOLO labels are "
                                "fractions of the image size (x / width); fix the line or "
                                "export the labels normalised")
            if len(parts) == 5:
                cx, cy, w, h = coords
                box = [width * (cx - w / 2), height * (cy - h / 2),
                       width * (cx + w / 2), height * (cy + h / 2)]
            else:
                xs, ys = coords[0::2], coords[1::2]
                box = [width * min(xs), height * min(ys), width * max(xs), height * max(ys)]
                polygons += 1
            boxes.append(fix_box(box, width, height, got, Path(path), f"line {n}"))
            labels.append(label)
        return boxes, labels, polygons
