"""The YOLO reader (mdk.data.yolo, data.yaml: mdk.data.yolo_yaml) on generated folders: the VOC
records exported with ``python -m mdk.tools.voc2yolo`` read back the same; both names forms and
nc alone; Roboflow's ``<split>/images`` with ``../`` paths; splits as .txt lists and lists of
both; background images; polygons; each bad input one line naming the file (and line)."""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from mdk.data.index import is_stale, build_meta
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.data.voc import VOCReader
from mdk.data.yolo import YOLOReader, label_path
from mdk.data.yolo_export import export_voc_to_yolo
from mdk.errors import DataError
from mdk.tools.voc2yolo import main as voc2yolo

CLASSES = list(SHAPE_CLASSES)


@pytest.fixture(scope="module")
def voc_root(tmp_path_factory) -> Path:
    # 80 px: fractions of 80 are not exact in binary, so the read-back is a real rounding check
    return ensure_shapes_dataset(tmp_path_factory.mktemp("d") / "shapes", num_train=10,
                                 num_val=4, image_size=80, seed=3)


@pytest.fixture
def yolo(voc_root, tmp_path) -> Path:
    """A private YOLO folder (images copied) of the VOC folder's train and val splits."""
    export_voc_to_yolo(voc_root, tmp_path / "yolo", class_names=CLASSES, copy=True)
    return tmp_path / "yolo"


def write_yaml(root: Path, doc: dict) -> Path:
    path = root / "data.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def assert_same(got, want, prefix: str | None = None) -> None:
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        if prefix is not None:
            assert a.image == f"{prefix}/{Path(b.image).name}"
        assert (a.width, a.height) == (b.width, b.height)
        assert a.labels.tolist() == b.labels.tolist() and a.difficult.sum() == 0
        assert a.boxes.dtype == b.boxes.dtype and a.boxes.shape == b.boxes.shape
        assert abs(a.boxes - b.boxes).max(initial=0) < 1e-4   # float32 pixels of an 80-px image


def test_voc2yolo_round_trip(voc_root, tmp_path, capsys):
    out = tmp_path / "out"
    assert voc2yolo([str(voc_root), str(out), "--splits", "train", "val:valid"]) == 0
    assert capsys.readouterr().out.split() == [str(out / "data.yaml")]
    doc = yaml.safe_load((out / "data.yaml").read_text())
    # default class list: the names the annotations use, sorted; keys as asked
    assert doc == {"train": "images/train", "valid": "images/valid", "nc": 5,
                   "names": sorted(CLASSES)}
    assert all(p.is_symlink() for p in (out / "images/train").iterdir())
    first = (out / "labels/train/000000.txt").read_text().splitlines()
    voc = VOCReader(voc_root, sorted(CLASSES)).records("train").records
    assert len(first) == len(voc[0].labels) and first[0].split()[0] == str(voc[0].labels[0])
    for split, key in (("train", "train"), ("val", "valid")):
        want = VOCReader(voc_root, sorted(CLASSES)).records(split).records
        reader = YOLOReader(out, None)
        assert reader.count(key) == len(want)
        assert_same(reader.records(key).records, want, f"images/{key}")
        assert reader.class_names == sorted(CLASSES)
    assert voc2yolo([str(tmp_path / "nope"), str(out)]) == 2
    assert "does not exist" in capsys.readouterr().out


def test_names_as_list_mapping_or_nc(yolo):
    want = YOLOReader(yolo, CLASSES).records("train").records
    doc = yaml.safe_load((yolo / "data.yaml").read_text())
    # a mapping in another key order, ids as text: the same classes
    write_yaml(yolo, {**doc, "names": {str(i): CLASSES[i] for i in (3, 0, 4, 1, 2)}, "nc": 5})
    reader = YOLOReader(yolo, None)
    assert reader.data_class_names("train", "val") == CLASSES
    assert_same(reader.records("train").records, want)
    # nc alone: class_<i>
    write_yaml(yolo, {"train": "images/train", "val": "images/val", "nc": 5})
    assert YOLOReader(yolo, None).data_class_names("train", "val") == [f"class_{i}" for i in range(5)]
    # a class list in another order: ids are matched by name
    reverse = CLASSES[::-1]
    write_yaml(yolo, doc)
    got = YOLOReader(yolo, reverse).records("train").records
    assert [r.labels.tolist() for r in got] == [[4 - v for v in r.labels.tolist()] for r in want]


@pytest.mark.parametrize("names, nc, needle", [
    ({0: "a", 1: "b", 5: "c"}, None, "names has the ids [0, 1, 5], not 0..2; number the classes "
                                     "from 0 without gaps"),
    (["a", "b"], 3, "nc: 3 but names lists 2 classes; make them agree"),
    (["a", "b", "a"], None, "names lists ['a'] more than once"),
    (None, None, "no names: and no nc:; list the classes as names: [a, b, ...]"),
    ({"x": "a"}, None, "names has the key 'x', not a class id"),
])
def test_bad_names_are_one_line(yolo, names, nc, needle):
    doc = {"train": "images/train", "val": "images/val"}
    doc.update({k: v for k, v in (("names", names), ("nc", nc)) if v is not None})
    path = write_yaml(yolo, doc)
    with pytest.raises(DataError) as e:
        YOLOReader(yolo, None).check(["train"])
    assert str(e.value).startswith(f"{path}: ") and needle in str(e.value)
    assert "\n" not in str(e.value)


def test_roboflow_layout_with_dotdot_paths(yolo, tmp_path):
    """Roboflow: <split>/images + <split>/labels, and ``train: ../train/images`` in a yaml beside
    them, read as ultralytics reads it (the ``../`` dropped when it leads nowhere)."""
    rf = tmp_path / "roboflow"
    for split, folder in (("train", "train"), ("val", "valid")):
        (rf / folder).mkdir(parents=True)
        shutil.copytree(yolo / "images" / split, rf / folder / "images")
        shutil.copytree(yolo / "labels" / split, rf / folder / "labels")
    write_yaml(rf, {"train": "../train/images", "val": "../valid/images", "nc": 5,
                    "names": CLASSES, "roboflow": {"workspace": "w", "version": 1}})
    reader = YOLOReader(rf, None)
    reader.check(["train", "val"])
    want = YOLOReader(yolo, CLASSES)
    assert_same(reader.records("val").records, want.records("val").records, "valid/images")
    # dataset.root may name the yaml itself: the image paths are then absolute
    got = YOLOReader(rf / "data.yaml", None).records("train").records
    assert got[0].image == str(rf / "train/images/000000.jpg")


def test_splits_as_lists_and_lists_of_both(yolo):
    images = sorted((yolo / "images" / "train").iterdir())
    # ./ lines relative to the list's folder, an absolute line, blank lines skipped
    (yolo / "first.txt").write_text("".join(f"./images/train/{p.name}\n" for p in images[:4])
                                    + f"\n{images[4]}\n")
    (yolo / "extra/images").mkdir(parents=True)
    (yolo / "extra/labels").mkdir()
    for p in images[5:]:   # the rest in another folder, with their labels by the same rule
        shutil.move(p, yolo / "extra/images" / p.name)
        shutil.move(yolo / "labels/train" / f"{p.stem}.txt", yolo / "extra/labels")
    write_yaml(yolo, {"train": ["first.txt", "extra/images"], "val": "images/val", "names": CLASSES})
    reader = YOLOReader(yolo, CLASSES)
    got = reader.records("train").records
    assert [r.image for r in got] == ([f"extra/images/{p.name}" for p in images[5:]]
                                      + [f"images/train/{p.name}" for p in images[:5]])  # sorted
    assert sum(len(r.labels) for r in got) > 0 and all(len(r.labels) for r in got[:5])
    assert yolo / "first.txt" in reader.sources("train")
    # a line naming no file: file:line
    (yolo / "first.txt").write_text("./images/train/000000.jpg\n./images/train/nope.jpg\n")
    with pytest.raises(DataError, match=rf"^{yolo}/first.txt:2: lists './images/train/nope.jpg', "
                       "which is not a file .*; add the image or remove the line$"):
        YOLOReader(yolo, CLASSES).count("train")


def test_background_images_and_the_index_key(yolo, tmp_path):
    """No label file, or an empty one: an image without objects; adding a label file makes the
    index stale (the key names every image's label file, present or not)."""
    (yolo / "labels/train/000001.txt").unlink()
    (yolo / "labels/train/000002.txt").write_text("\n")
    reader = YOLOReader(yolo, CLASSES)
    got = reader.records("train").records
    assert len(got) == 10 and [len(r.labels) for r in got[1:3]] == [0, 0]
    assert got[1].boxes.shape == (0, 4) and (got[1].width, got[1].height) == (80, 80)
    meta = build_meta(reader, "train", tmp_path / "meta" / "train.txt")
    assert not is_stale(YOLOReader(yolo, CLASSES), "train", meta)
    (yolo / "labels/train/000001.txt").write_text("0 0.5 0.5 0.25 0.25\n")
    assert is_stale(YOLOReader(yolo, CLASSES), "train", meta)


def test_polygons_become_boxes_said_once(yolo, caplog):
    (yolo / "labels/train/000000.txt").write_text(
        "1 0.1 0.2 0.5 0.25 0.3 0.6\n"                  # a triangle
        "2 0.5 0.5 0.5 0.5\n"                          # a box: 0.25..0.75
        "0 0.0 0.0 1.0 0.0 1.0 0.5 0.0 0.5\n")          # a rectangle polygon
    (yolo / "labels/train/000003.txt").write_text("3 0.2 0.2 0.4 0.2 0.4 0.4 0.2 0.4\n")
    with caplog.at_level(logging.WARNING):
        got = YOLOReader(yolo, CLASSES).records("train").records
    assert np.allclose(got[0].boxes, [[8, 16, 40, 48], [20, 20, 60, 60], [0, 0, 80, 40]],
                       atol=1e-4, rtol=0)
    assert got[0].labels.tolist() == [1, 2, 0]
    assert np.allclose(got[3].boxes, [[16, 16, 32, 32]], atol=1e-4, rtol=0)
    said = [r.getMessage() for r in caplog.records if "polygons" in r.getMessage()]
    assert said == [f"{yolo} split 'train': 3 label lines are segmentation polygons; each is read "
                    "as its bounding box"]


@pytest.mark.parametrize("line, needle", [
    ("0 0.5 1.2 0.1 0.1", "coordinate 1.2 is outside 0-1; YOLO labels are fractions of the image "
                          "size (x / width); fix the line or export the labels normalised"),
    ("0 -0.5 0.5 0.1 0.1", "coordinate -0.5 is outside 0-1"),
    ("7 0.5 0.5 0.1 0.1", "class id '7' is not one of data.yaml's ids 0..4"),
    ("1.5 0.5 0.5 0.1 0.1", "class id '1.5' is not one of data.yaml's ids 0..4"),
    ("0 0.5 0.5 0.1", "4 fields; a label line is 'class cx cy w h' (5 numbers, normalised to 0-1) "
                      "or 'class x1 y1 x2 y2 x3 y3 ...' (a polygon of 3 or more points)"),
    ("0 0.5 0.5 0.1 0.1 0.3", "6 fields; a label line is"),
    ("0 0.5 abc 0.1 0.1", "'abc' is not a number; a label line is"),
    ("0 0.5 nan 0.1 0.1", "coordinate nan is outside 0-1"),
])
def test_each_bad_label_line_names_file_and_line(yolo, line, needle):
    path = yolo / "labels/train/000004.txt"
    path.write_text(path.read_text() + line + "\n")
    n = len(path.read_text().splitlines())
    with pytest.raises(DataError) as e:
        YOLOReader(yolo, CLASSES).records("train")
    assert str(e.value).startswith(f"{path}:{n}: ") and needle in str(e.value)


def test_a_class_left_out_of_the_class_list_names_the_line(yolo):
    with pytest.raises(DataError, match=r"000000.txt:1: class id \d is '\w+' in data.yaml, not in "
                       r"dataset.class_names \[.*\]; add it to the class list or fix the label$"):
        YOLOReader(yolo, ["nothing"]).records("train")


def test_unsafe_yaml_tag_runs_nothing(yolo, tmp_path):
    marker = tmp_path / "ran"
    path = yolo / "data.yaml"
    path.write_text(f"train: images/train\nval: images/val\nnames: !!python/object/apply:os.system "
                    f"['touch {marker}']\n")
    with pytest.raises(DataError) as e:
        YOLOReader(yolo, None).check(["train"])
    assert str(e.value) == (f"{path}:3: tag !!python/object/apply:os.system is not allowed: mdk "
                            "reads data.yaml with a safe loader and runs nothing from it; remove "
                            "the tag (plain values only)")
    assert not marker.exists()
    path.write_text("train: [images/train\n")
    with pytest.raises(DataError, match=rf"^{path}:\d: not valid YAML \(.*\); fix the file$"):
        YOLOReader(yolo, None).check(["train"])


def test_download_key_is_ignored_and_said_once(yolo, caplog, tmp_path):
    marker = tmp_path / "fetched"
    doc = yaml.safe_load((yolo / "data.yaml").read_text())
    write_yaml(yolo, {**doc, "download": f"import os; os.system('touch {marker}')"})
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            YOLOReader(yolo, None).records("val")
    said = [r.getMessage() for r in caplog.records if "download" in r.getMessage()]
    assert said == [f"{yolo / 'data.yaml'}: its download: key is ignored: mdk fetches nothing at "
                    "run time (the data must already be in place)"]
    assert not marker.exists()


def test_missing_split_yaml_or_root_is_one_line(yolo, tmp_path):
    path = yolo / "data.yaml"
    doc = yaml.safe_load(path.read_text())
    write_yaml(yolo, {**doc, "val": "images/valid"})
    with pytest.raises(DataError) as e:
        YOLOReader(yolo, None).check(["train", "val"])
    assert str(e.value) == (f"{path}: val: 'images/valid' is {yolo / 'images/valid'}, which does "
                            f"not exist; fix the path (relative to {yolo}) or add the folder")
    with pytest.raises(DataError, match=r"no test: key; set dataset.train_split/val_split to "
                       r"keys it has \(found: \['train', 'val'\]\)"):
        YOLOReader(yolo, None).check(["test"])
    shutil.rmtree(yolo / "images/train")
    (yolo / "images/train").mkdir()
    with pytest.raises(DataError, match=r"split 'train' \(.*\) holds no images"):
        YOLOReader(yolo, None).count("train")
    path.unlink()
    (yolo / "classes.txt").write_text("a\n")
    with pytest.raises(DataError, match=rf"^{yolo}: no data.yaml \(found none\); write one with "
                       r"train: and val: .*Label Studio"):
        YOLOReader(yolo, None).check(["train"])
    with pytest.raises(DataError, match="does not exist; point dataset.root at the folder holding"):
        YOLOReader(tmp_path / "nope", None).check(["train"])


def test_label_path_rule():
    sep = os.sep
    assert label_path(f"{sep}d{sep}images{sep}train{sep}a.b.jpg") == \
        f"{sep}d{sep}labels{sep}train{sep}a.b.txt"
    # the last /images/ only; no /images/ at all: beside the image
    assert label_path("/x/images/y/images/z.png") == "/x/images/y/labels/z.txt"
    assert label_path("/x/pics/z.png") == "/x/pics/z.txt"
