"""Catalogue, COCO entries (docs/errors.md): what `python run.py dataset=coco` says for each bad
COCO input. Each test breaks a private copy of a tiny COCO folder (the built-in data exported with
voc2coco, images copied), runs the command in-process (tests/helpers/catalogue.py), and asserts the
one stderr line naming the file and what to do, exit status 1, and that no file was changed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.catalogue import CLASSES, assert_intact, cli, one_error_line, snapshot
from helpers.catalogue import voc_master  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def coco_master(voc_master, tmp_path_factory) -> Path:  # noqa: F811
    from mdk.data.coco_export import export_voc_to_coco

    root = tmp_path_factory.mktemp("coco") / "COCO"
    export_voc_to_coco(voc_master, root, ["train", "val"], copy=True)
    return root


@pytest.fixture
def coco(coco_master, tmp_path) -> Path:
    root = tmp_path / "COCO"
    shutil.copytree(coco_master, root)
    return root


def coco_args(root: Path) -> list[str]:
    return ["dataset=coco", f"dataset.root={root}", "dataset.train_split=train",
            "dataset.val_split=val", CLASSES, "dataset.num_classes=5", "dataset.num_workers=0"]


def edit(root: Path, change) -> Path:
    """Apply ``change`` to the train JSON (a dict); return the file."""
    path = root / "annotations" / "instances_train.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return path


def rename_used_category(doc: dict) -> None:
    used = doc["annotations"][0]["category_id"]
    next(c for c in doc["categories"] if c["id"] == used)["name"] = "hexagon"


# (case, how to break it, needles of the one line after the file name; before any training?)
CASES = [
    ("malformed_json", None, ["malformed JSON (", "fix or regenerate the file"], True),
    ("no_annotations_list", lambda d: d.pop("annotations"),
     ["no 'annotations' list; a COCO instances file holds images, annotations and categories"], True),
    ("empty_images", lambda d: d.update(images=[], annotations=[]),
     ["split 'train' lists no images; add its images to the file"], True),
    ("annotation_without_bbox", lambda d: d["annotations"][0].pop("bbox"),
     ["annotations[0] has no 'bbox'; every COCO annotation needs it"], False),
    ("image_without_file_name", lambda d: d["images"][2].pop("file_name"),
     ["images[2] has no 'file_name'; every COCO image needs it"], False),
    ("category_not_in_class_names", rename_used_category,
     ["annotations[0] has category 'hexagon' (id ", "not in dataset.class_names",
      "add it to the class list or fix the annotation"], False),
    ("bbox_not_four_numbers", lambda d: d["annotations"][1].update(bbox=[1, 2]),
     ["annotations[1] has bbox [1, 2], not four numbers [x, y, width, height]"], False),
    ("unknown_image_id", lambda d: d["annotations"][0].update(image_id=999),
     ["annotations[0] has image_id 999, which is not in images; fix or remove the annotation"], False),
    ("unknown_category_id", lambda d: d["annotations"][0].update(category_id=77),
     ["annotations[0] has category_id 77, which is not in categories"], False),
    ("bad_iscrowd", lambda d: d["annotations"][0].update(iscrowd=2),
     ["annotations[0] has iscrowd=2, not 0 or 1"], False),
    ("image_size_not_positive", lambda d: d["images"][0].update(width=0),
     ["images[0] (000000.jpg) has size 0x64, not positive numbers; fix width/height"], False),
]


@pytest.mark.parametrize("name, change, needles, early", CASES, ids=[c[0] for c in CASES])
def test_bad_coco_json_is_one_line(coco, tmp_path, capsys, name, change, needles, early):
    if change is None:
        path = coco / "annotations" / "instances_train.json"
        path.write_text(path.read_text()[:200])  # cut off
    else:
        path = edit(coco, change)
    before = snapshot(coco)
    status, out, err = cli(tmp_path, *coco_args(coco), capsys=capsys)
    one_error_line(status, err, f"data error: {path}: ", *needles)
    assert_intact(before)
    # caught by the launcher's pre-flight, before any stage starts, or by the stage's reading
    assert ("=== step1 ===" in out) is not early


def test_listed_image_missing(coco, tmp_path, capsys):
    image = coco / "train" / "000003.jpg"
    image.unlink()
    before = snapshot(coco)
    status, _, err = cli(tmp_path, *coco_args(coco), capsys=capsys)
    one_error_line(status, err, f"data error: {image}: image '000003.jpg' listed in "
                   f"{coco / 'annotations' / 'instances_train.json'} is missing; add the image, "
                   "fix its file_name, or point dataset.reader.images at the image folder")
    assert_intact(before)


def test_missing_annotation_file(coco, tmp_path, capsys):
    status, _, err = cli(tmp_path, *coco_args(coco), "dataset.train_split=train2017", capsys=capsys)
    one_error_line(status, err, f"data error: {coco}/annotations/instances_train2017.json: "
                   "annotation file not found; set dataset.train_split/val_split to splits that "
                   "have one, or dataset.reader.annotations to where it is (found: "
                   "['instances_train.json', 'instances_val.json'])")


def test_root_does_not_exist_or_is_not_set(tmp_path, capsys):
    missing = tmp_path / "no" / "coco"
    status, _, err = cli(tmp_path, *coco_args(missing), capsys=capsys)
    one_error_line(status, err, f"data error: dataset.root='{missing}' does not exist; point "
                   "dataset.root at a COCO folder holding annotations/instances_{split}.json and "
                   "the image folder {split}/")
    assert not missing.exists()
    status, _, err = cli(tmp_path, "dataset=coco", capsys=capsys)
    one_error_line(status, err, "data error: dataset.root is not set; pass dataset.root=/path/to/"
                   "the/data (the folder conf/dataset/coco.yaml describes)")


def test_box_outside_or_zero_area_is_a_counted_warning(coco, tmp_path, capsys):
    """Sane data loss, not an error (the policy of every format): clipped / dropped with a count,
    and the run finishes."""
    def add(doc: dict) -> None:
        ann = dict(doc["annotations"][0], id=10_000, bbox=[50, 50, 40, 20])   # past the 64px edge
        doc["annotations"] += [ann, dict(ann, id=10_001, bbox=[10, 10, 0, 20])]  # zero width
    edit(coco, add)
    before = snapshot(coco)
    status, out, err = cli(tmp_path, *coco_args(coco), capsys=capsys)
    assert status == 0, err[-2000:]
    assert ("split 'train', reading the annotations: 1 boxes clipped to the image, 1 zero-area "
            "boxes kept for evaluation only") in out
    assert_intact(before)
    assert (tmp_path / "ck" / "step1" / "last.pth").is_file()
