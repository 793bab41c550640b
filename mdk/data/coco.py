"""COCO instances JSON: :class:`COCOReader`, the reader of ``dataset=coco`` (its layout, keys and
rules: conf/dataset/coco.yaml). Images and annotations keep the file's order; boxes follow the
bad-box policy of :mod:`mdk.data.records`; anything else wrong is a one-line
:class:`~mdk.errors.DataError` naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from mdk.data.records import SplitRecords, fix_box, make_record
from mdk.errors import DataError

ANNOTATIONS = "annotations/instances_{split}.json"
IMAGES = "{split}"
SECTIONS = ("images", "annotations", "categories")
SINGULAR = {"images": "image", "annotations": "annotation", "categories": "category"}


def _get(obj: Any, key: str, path: Path, where: str) -> Any:
    if not isinstance(obj, dict):
        raise DataError(f"{path}: {where} is {type(obj).__name__}, not an object; fix or "
                        "regenerate the file")
    if key not in obj:
        kind = SINGULAR[where.split("[")[0]]
        raise DataError(f"{path}: {where} has no '{key}'; every COCO {kind} needs it (fix or "
                        "regenerate the file)")
    return obj[key]


def _id(obj: Any, key: str, path: Path, where: str) -> int | str:
    v = _get(obj, key, path, where)
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise DataError(f"{path}: {where} has {key}={v!r}, not an integer id; fix the file")
    return v


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class COCOReader:
    """COCO instances JSON + an image folder. ``annotations`` and ``images``: path patterns
    relative to ``root`` with ``{split}`` for the split name."""

    def __init__(self, root: str | Path, class_names: Sequence[str],
                 annotations: str = ANNOTATIONS, images: str = IMAGES) -> None:
        self.root = Path(root).expanduser()
        self.class_names = list(class_names)
        self.annotations, self.images = str(annotations), str(images)
        self._docs: dict[str, dict] = {}   # split -> parsed JSON (COCO files are large)

    def _pattern(self, key: str, split: str) -> str:
        pattern = getattr(self, key)
        try:
            return pattern.format(split=split)
        except (KeyError, IndexError, ValueError):
            raise DataError(f"dataset.reader.{key}={pattern!r} is not a path pattern with "
                            "{split} as its only placeholder; fix it in the dataset YAML") from None

    def annotation_file(self, split: str) -> Path:
        return self.root / self._pattern("annotations", split)

    def _load(self, split: str) -> dict:
        if split in self._docs:
            return self._docs[split]
        if not self.root.is_dir():
            raise DataError(f"dataset.root={str(self.root)!r} does not exist; point dataset.root "
                            f"at a COCO folder holding {self.annotations} and the image folder "
                            f"{self.images}/")
        path = self.annotation_file(split)
        try:
            with open(path, "rb") as f:
                doc = json.load(f)
        except FileNotFoundError:
            have = sorted(p.name for p in path.parent.glob("*.json"))[:10]
            raise DataError(f"{path}: annotation file not found; set dataset.train_split/val_split "
                            f"to splits that have one, or dataset.reader.annotations to where it "
                            f"is (found: {have})") from None
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise DataError(f"{path}: malformed JSON ({exc}); fix or regenerate the file") from None
        for key in SECTIONS:
            if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
                raise DataError(f"{path}: no '{key}' list; a COCO instances file holds images, "
                                "annotations and categories (is this a COCO instances JSON?)")
        if not doc["images"]:
            raise DataError(f"{path}: split {split!r} lists no images; add its images to the file")
        self._docs[split] = doc
        return doc

    def check(self, splits: Sequence[str]) -> None:
        for split in splits:
            self._load(split)

    def count(self, split: str) -> int:
        return len(self._load(split)["images"])

    def sources(self, split: str) -> list[Path]:
        return [self.annotation_file(split)]

    def _categories(self, split: str) -> dict[int | str, str]:
        doc, path = self._load(split), self.annotation_file(split)
        return {_id(c, "id", path, f"categories[{k}]"): str(_get(c, "name", path, f"categories[{k}]"))
                for k, c in enumerate(doc["categories"])}

    def data_class_names(self, train_split: str, val_split: str) -> list[str]:
        """The train file's categories by id; a category only the val file has is refused."""
        cats, path = self._categories(train_split), self.annotation_file(train_split)
        names = [cats[k] for k in sorted(cats, key=lambda k: (isinstance(k, str), k))]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice or not names:
            raise DataError(f"{path}: categories " + (f"name {twice} more than once" if twice
                            else "is empty") + "; give each class one category (or set "
                            "dataset.class_names=[...])")
        extra = sorted(set(self._categories(val_split).values()) - set(names))
        if extra:
            raise DataError(f"{self.annotation_file(val_split)}: categories {extra} are not in "
                            f"the {train_split!r} file's categories ({path}), so the model could "
                            "never learn them; add them there, or set dataset.class_names to a "
                            "list that holds them")
        return names

    def records(self, split: str) -> SplitRecords:
        doc, path = self._load(split), self.annotation_file(split)
        cats = self._categories(split)
        index = {name: i for i, name in enumerate(self.class_names)}
        folder = PurePosixPath(self._pattern("images", split))
        images: dict[int | str, tuple[str, int, int]] = {}
        for k, im in enumerate(doc["images"]):
            where = f"images[{k}]"
            iid = _id(im, "id", path, where)
            name = _get(im, "file_name", path, where)
            size = [_get(im, key, path, where) for key in ("width", "height")]
            if not all(_number(v) and v > 0 for v in size):
                raise DataError(f"{path}: {where} ({name}) has size {size[0]!r}x{size[1]!r}, not "
                                "positive numbers; fix width/height")
            if iid in images:
                raise DataError(f"{path}: {where} repeats image id {iid!r}; each image once")
            rel = (folder / str(name)).as_posix()
            if not (self.root / rel).is_file():
                raise DataError(f"{self.root / rel}: image {name!r} listed in {path} is missing; "
                                "add the image, fix its file_name, or point "
                                "dataset.reader.images at the image folder")
            images[iid] = (rel, int(size[0]), int(size[1]))
        objects: dict[int | str, tuple[list, list, list]] = {iid: ([], [], []) for iid in images}
        out = SplitRecords([])
        for k, ann in enumerate(doc["annotations"]):
            where = f"annotations[{k}]"
            iid, cid = _id(ann, "image_id", path, where), _id(ann, "category_id", path, where)
            bbox = _get(ann, "bbox", path, where)
            if iid not in images:
                raise DataError(f"{path}: {where} has image_id {iid!r}, which is not in images; "
                                "fix or remove the annotation")
            if cid not in cats:
                raise DataError(f"{path}: {where} has category_id {cid!r}, which is not in "
                                "categories; fix or remove the annotation")
            if cats[cid] not in index:
                raise DataError(f"{path}: {where} has category {cats[cid]!r} (id {cid!r}), not in "
                                f"dataset.class_names {self.class_names}; add it to the class "
                                "list or fix the annotation")
            if not (isinstance(bbox, list) and len(bbox) == 4 and all(map(_number, bbox))):
                raise DataError(f"{path}: {where} has bbox {bbox!r}, not four numbers [x, y, "
                                "width, height]; fix the annotation")
            crowd = ann.get("iscrowd", 0)
            if crowd not in (0, 1):
                raise DataError(f"{path}: {where} has iscrowd={crowd!r}, not 0 or 1; fix the "
                                "annotation")
            x, y, w, h = (float(v) for v in bbox)
            _, width, height = images[iid]
            boxes, labels, difficult = objects[iid]
            boxes.append(fix_box([x, y, x + w, y + h], width, height, out, path, where))
            labels.append(index[cats[cid]])
            difficult.append(bool(crowd))
        for iid, (rel, width, height) in images.items():
            out.records.append(make_record(rel, width, height, *objects[iid]))
        return out
