"""Class names read from the data when ``dataset.class_names`` is left out (mdk.data.class_names):
VOC's sorted object names of the train split (parts' names not counted), COCO's categories by
id, YOLO's names; num_classes follows or is checked; the cache beside the index; a class only in
val named in one line; and with the real command: the list logged, stored in the checkpoint, and
a resume whose data now gives another order refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose
from helpers.catalogue import cli, one_error_line, voc_master  # noqa: F401  (fixture)
from mdk.data.class_names import fill_class_names, read_class_names
from mdk.data.coco_export import export_voc_to_coco
from mdk.data.records import make_record, only_in_val
from mdk.data.voc import VOCReader
from mdk.data.yolo_export import export_voc_to_yolo
from mdk.errors import ConfigError, DataError

SORTED = ["circle", "cross", "square", "star", "triangle"]
PART = "<part><name>head</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax>" \
       "</bndbox></part>"


def voc_node(root: Path, **extra) -> dict:
    return {"name": "voc", "root": str(root), "train_split": "train", "val_split": "val",
            "class_names": None, "num_classes": None, **extra}


def add_object(xml: Path, name: str, inner: str = "") -> None:
    xml.write_text(xml.read_text().replace("</annotation>", (
        f"<object><name>{name}</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>20</xmax>"
        f"<ymax>20</ymax></bndbox>{inner}</object></annotation>")))


@pytest.fixture
def voc(voc_master, tmp_path) -> Path:  # noqa: F811
    import shutil

    shutil.copytree(voc_master, tmp_path / "VOC")
    return tmp_path / "VOC"


def test_voc_names_are_the_sorted_train_names_and_cached(voc, tmp_path, monkeypatch):
    add_object(voc / "Annotations" / "000002.xml", "circle", PART)   # a part's name is no class
    cache = tmp_path / "cache"
    assert read_class_names(voc_node(voc), voc, cache) == SORTED
    held = json.loads(next(cache.glob("meta/voc-*/class_names.json")).read_text())
    assert held["names"] == SORTED and held["splits"] == ["train", "val"]
    # unchanged annotations: the cache answers, nothing is parsed
    monkeypatch.setattr(VOCReader, "data_class_names", lambda *a: pytest.fail("parsed again"))
    assert read_class_names(voc_node(voc), voc, cache) == SORTED
    monkeypatch.undo()
    add_object(voc / "Annotations" / "000003.xml", "apple")          # a new class: read again
    assert read_class_names(voc_node(voc), voc, cache) == ["apple", *SORTED]


def test_a_class_only_in_val_is_one_line(voc):
    xml = voc / "Annotations" / "000020.xml"                           # a val image
    add_object(xml, "hexagon")
    with pytest.raises(DataError) as e:
        read_class_names(voc_node(voc), voc)
    assert str(e.value) == (f"{xml}: class 'hexagon' is in the 'val' split but in no annotation "
                            "of the 'train' split, so the model could never learn it; add train "
                            "images of it, fix the name, or set dataset.class_names to a list "
                            "that holds it")


def test_coco_categories_by_id_and_yolo_names(voc, tmp_path):
    export_voc_to_coco(voc, tmp_path / "coco", ["train", "val"],
                       ["circle", "square", "triangle", "star", "cross"])
    path = tmp_path / "coco/annotations/instances_train.json"
    doc = json.loads(path.read_text())
    doc["categories"] = doc["categories"][::-1]                        # file order is not id order
    path.write_text(json.dumps(doc))
    coco = voc_node(tmp_path / "coco", reader={"_target_": "mdk.data.coco.COCOReader"})
    assert read_class_names(coco, tmp_path / "coco") == ["circle", "square", "triangle", "star",
                                                          "cross"]
    val = tmp_path / "coco/annotations/instances_val.json"
    doc = json.loads(val.read_text())
    doc["categories"].append({"id": 99, "name": "hexagon"})
    val.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=rf"^{val}: categories \['hexagon'\] are not in the 'train' "
                       "file's categories"):
        read_class_names(coco, tmp_path / "coco")
    export_voc_to_yolo(voc, tmp_path / "yolo", class_names=["star", "circle", "square",
                                                             "triangle", "cross"])
    yolo = voc_node(tmp_path / "yolo", reader={"_target_": "mdk.data.yolo.YOLOReader"})
    assert read_class_names(yolo, tmp_path / "yolo") == ["star", "circle", "square", "triangle",
                                                          "cross"]


def test_num_classes_follows_or_is_checked(voc, tmp_path):
    common = ["dataset=voc", f"dataset.root={voc}", "dataset.train_split=train",
              "dataset.val_split=val", f"paths.data={tmp_path / 'data'}"]
    cfg = compose(common)
    fill_class_names(cfg)
    assert list(cfg.dataset.class_names) == SORTED and cfg.dataset.num_classes == 5
    assert cfg.model.net.num_classes == 5 and cfg.head.num_classes == 5   # interpolations follow
    cfg = compose([*common, "dataset.num_classes=3"])
    with pytest.raises(ConfigError) as e:
        fill_class_names(cfg)
    assert str(e.value) == (f"dataset.num_classes=3 but the data names 5 classes {SORTED} "
                            f"(dataset.class_names read from {voc}); leave dataset.num_classes "
                            "out or make it agree")
    cfg = compose([*common, "dataset.class_names=[a,b]"])                # a list given: kept
    fill_class_names(cfg)
    assert OmegaConf.to_container(cfg.dataset.class_names) == ["a", "b"]
    assert cfg.dataset.num_classes == 2


def test_only_in_val_names_the_classes():
    def rec(*labels):
        return make_record("x.jpg", 10, 10, [[0, 0, 5, 5]] * len(labels), labels,
                           [False] * len(labels))
    names = ["a", "b", "c"]
    assert only_in_val([rec(0, 1)], [rec(0, 1), rec()], names) is None
    assert only_in_val([rec(0), rec()], [rec(1, 2, 2)], names) == (
        "class(es) b (1), c (2) have objects in the val split but none in the train split: the "
        "model cannot learn them and each counts as a miss; add train images of them or leave "
        "them out of val")


def test_the_command_logs_the_list_and_refuses_a_resume_in_another_order(voc, tmp_path, capsys):
    args = ["dataset=voc", f"dataset.root={voc}", "dataset.train_split=train",
            "dataset.val_split=val", "dataset.num_workers=0"]
    status, out, err = cli(tmp_path, *args, capsys=capsys)
    assert status == 0, err[-2000:]
    said = [line.split(" - ", 1)[1] for line in out.splitlines() if "class_names read" in line]
    assert said == [f"dataset.class_names read from {voc}: [{', '.join(SORTED)}] (5 classes)"]
    last = torch.load(tmp_path / "ck/step1/last.pth", weights_only=False)
    assert last["meaning"]["dataset.class_names"] == SORTED
    add_object(voc / "Annotations" / "000001.xml", "apple")   # the data now reads another list
    status, _, err = cli(tmp_path, *args, capsys=capsys)
    one_error_line(status, err, "checkpoint error: dataset.class_names=['apple', 'circle', ",
                   f"differs from the checkpoint's {SORTED}")
