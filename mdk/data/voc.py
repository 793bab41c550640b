"""Pascal VOC reading: annotation XML, split lists, image lookup, and :class:`VOCReader`.

Boxes follow the bad-box policy of :mod:`mdk.data.records`; anything else wrong in a file raises
:class:`DataError` naming it (guessing would silently train on wrong labels). Coordinates are
kept as written in the XML (no 1-based shift).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Sequence

from mdk.data.records import Record, SplitRecords, fix_box, make_record
from mdk.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def _text(node: ET.Element, tag: str, path: Path, where: str) -> str:
    child = node.find(tag)
    if child is None or child.text is None or not child.text.strip():
        raise DataError(f"{path}: missing <{tag}> in {where}; every VOC annotation needs it "
                        "(fix or regenerate the annotation file)")
    return child.text.strip()


def _number(node: ET.Element, tag: str, path: Path, where: str) -> float:
    raw = _text(node, tag, path, where)
    try:
        return float(raw)
    except ValueError:
        raise DataError(f"{path}: <{tag}> in {where} is {raw!r}, not a number "
                        "(fix the annotation file)") from None


def parse_voc_xml(path: str | Path, class_names: Sequence[str], image: str = ""
                  ) -> tuple[Record, int, int]:
    """Parse one VOC annotation file: ``(its record, boxes clipped, boxes of zero area)``.
    ``image``: the record's image path, relative to the dataset root."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        raise DataError(f"{path}: annotation file not found; the split lists an image whose "
                        "Annotations/<id>.xml is missing (add it or remove the id from the split)"
                        ) from None
    except ET.ParseError as exc:
        raise DataError(f"{path}: malformed XML ({exc}); fix or regenerate the file") from None
    if root.tag != "annotation":
        raise DataError(f"{path}: root element is <{root.tag}>, expected <annotation> "
                        "(is this a Pascal VOC annotation?)")
    size = root.find("size")
    if size is None:
        raise DataError(f"{path}: missing <size> (width/height); add it to the annotation")
    width, height = (int(_number(size, tag, path, "<size>")) for tag in ("width", "height"))
    if width <= 0 or height <= 0:
        raise DataError(f"{path}: image size {width}x{height} is not positive; fix <size>")
    index = {name: i for i, name in enumerate(class_names)}
    boxes, labels, difficult = [], [], []
    got = SplitRecords([])  # its counts only
    for k, obj in enumerate(root.findall("object")):
        where = f"<object> #{k}"
        name = _text(obj, "name", path, where)
        if name not in index:
            raise DataError(f"{path}: {where} has class {name!r}, not in dataset.class_names "
                            f"{list(class_names)}; add it to the class list or fix the annotation")
        bb = obj.find("bndbox")
        if bb is None:
            raise DataError(f"{path}: {where} ({name}) has no <bndbox>; add one or remove the object")
        box = [_number(bb, t, path, f"{where} <bndbox>") for t in ("xmin", "ymin", "xmax", "ymax")]
        is_difficult = (obj.findtext("difficult") or "0").strip() not in ("0", "")
        boxes.append(fix_box(box, width, height, got, path, f"{where} ({name})"))
        labels.append(index[name])
        difficult.append(is_difficult)
    return make_record(image, width, height, boxes, labels, difficult), got.clipped, got.zero_area


def check_root(root: str | Path) -> Path:
    """The dataset root must exist and look like a VOC year folder (``.../VOC2007``)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"dataset.root={str(root)!r} does not exist; point dataset.root at a VOC "
                        "folder holding JPEGImages/, Annotations/ and ImageSets/Main/ "
                        "(e.g. /path/to/VOCdevkit/VOC2007)")
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        if not (root / sub).is_dir():
            raise DataError(f"dataset.root={str(root)!r} has no {sub}/ folder; it must be a VOC "
                            "year folder (e.g. VOCdevkit/VOC2007), not its parent")
    return root


def split_file(root: str | Path, split: str) -> Path:
    return Path(root) / "ImageSets" / "Main" / f"{split}.txt"


def read_split(root: str | Path, split: str) -> list[str]:
    """Image ids of ``ImageSets/Main/<split>.txt`` (first column; VOC class files have two)."""
    root = check_root(root)
    path = split_file(root, split)
    if not path.is_file():
        have = sorted(p.stem for p in path.parent.glob("*.txt"))[:10]
        raise DataError(f"{path}: split file not found; set dataset.train_split/val_split to one "
                        f"of the existing splits (found: {have})")
    ids = [line.split()[0] for line in path.read_text().splitlines() if line.strip()]
    if not ids:
        raise DataError(f"{path}: split {split!r} is empty; list one image id per line")
    return ids


def find_image(root: str | Path, image_id: str, split_path: Path | None = None) -> Path:
    """``JPEGImages/<id>.jpg`` (or .jpeg/.png)."""
    base = Path(root) / "JPEGImages"
    for ext in IMAGE_EXTENSIONS:
        candidate = base / f"{image_id}{ext}"
        if candidate.is_file():
            return candidate
    listed = f" listed in {split_path}" if split_path else ""
    raise DataError(f"{base / image_id}.jpg: image {image_id!r}{listed} is missing (looked for "
                    f"{', '.join(IMAGE_EXTENSIONS)}); add the image or remove the id from the split")


def object_names(path: Path) -> list[str]:
    """The ``<name>`` of each ``<object>`` of one annotation (not its parts' names); a file that
    does not parse gives none (reading it for the records then names it)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    return [n for n in ((obj.findtext("name") or "").strip() for obj in root.iter("object")) if n]


def split_class_names(root: str | Path, split: str) -> dict[str, Path]:
    """Each object name of ``split``'s annotations -> the first file that uses it."""
    root = Path(root)
    first: dict[str, Path] = {}
    for image_id in read_split(root, split):
        path = root / "Annotations" / f"{image_id}.xml"
        for name in object_names(path):
            first.setdefault(name, path)
    return first


class VOCReader:
    """Pascal VOC layout: ``<root>/JPEGImages/<id>.jpg``, ``Annotations/<id>.xml`` and the split
    lists ``ImageSets/Main/<split>.txt``; records in split-list order. Takes no keys of its own."""

    def __init__(self, root: str | Path, class_names: Sequence[str]) -> None:
        self.root = Path(root).expanduser()
        self.class_names = list(class_names)

    def check(self, splits: Sequence[str]) -> None:
        check_root(self.root)
        for split in splits:
            read_split(self.root, split)  # missing or empty split file

    def count(self, split: str) -> int:
        return len(read_split(self.root, split))

    def records(self, split: str) -> SplitRecords:
        root = check_root(self.root).resolve()
        split_path = split_file(root, split)
        out = SplitRecords([])
        for image_id in read_split(root, split):
            image = find_image(root, image_id, split_path)
            rec, clipped, flat = parse_voc_xml(root / "Annotations" / f"{image_id}.xml",
                                               self.class_names, image.relative_to(root).as_posix())
            out.records.append(rec)
            out.clipped, out.zero_area = out.clipped + clipped, out.zero_area + flat
        return out

    def data_class_names(self, train_split: str, val_split: str) -> list[str]:
        """The sorted set of object names of the train split; a name only the val split uses
        is refused (no class list could train it)."""
        train = split_class_names(self.root, train_split)
        extra = {n: p for n, p in split_class_names(self.root, val_split).items() if n not in train}
        if extra:
            name, path = next(iter(extra.items()))
            others = f" (and {sorted(extra)[1:]})" if len(extra) > 1 else ""
            raise DataError(f"{path}: class {name!r}{others} is in the {val_split!r} split but in "
                            f"no annotation of the {train_split!r} split, so the model could "
                            "never learn it; add train images of it, fix the name, or set "
                            "dataset.class_names to a list that holds it")
        if not train:
            raise DataError(f"{split_file(self.root, train_split)}: no object in any annotation "
                            "of the split, so no class to read; set dataset.class_names=[...]")
        return sorted(train)

    def sources(self, split: str) -> list[Path]:
        ids = read_split(self.root, split)
        return [split_file(self.root, split)] + [self.root / "Annotations" / f"{i}.xml" for i in ids]
