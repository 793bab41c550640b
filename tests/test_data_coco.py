"""The COCO reader (mdk.data.coco) and the VOC -> COCO export (mdk.data.coco_export,
``python -m mdk.tools.voc2coco``): the export read back gives the VOC reader's records bit for bit,
and ``dataset=coco`` trains exactly as the VOC form of the same data."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import torch

from conftest import REPO, TINY, run_cmd_env
from mdk.data.coco import COCOReader
from mdk.data.coco_export import export_voc_to_coco
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.data.voc import VOCReader
from mdk.models.heads import YoloV1Head
from mdk.tools.voc2coco import main as voc2coco

CLASSES = list(SHAPE_CLASSES)
# One object of each kind the bad-box policy and the difficult flag treat specially.
EXTRA = ("<object><name>star</name><difficult>1</difficult><bndbox><xmin>3</xmin><ymin>4</ymin>"
         "<xmax>20</xmax><ymax>30</ymax></bndbox></object>"
         "<object><name>cross</name><bndbox><xmin>10.5</xmin><ymin>0.25</ymin><xmax>33.75</xmax>"
         "<ymax>17.125</ymax></bndbox></object>"
         "<object><name>circle</name><bndbox><xmin>50</xmin><ymin>40</ymin><xmax>90</xmax>"
         "<ymax>60</ymax></bndbox></object>"                                   # clipped at 64
         "<object><name>square</name><bndbox><xmin>9</xmin><ymin>9</ymin><xmax>9</xmax>"
         "<ymax>30</ymax></bndbox></object>")                                  # zero area: kept


@pytest.fixture(scope="module")
def voc_root(tmp_path_factory) -> Path:
    root = ensure_shapes_dataset(tmp_path_factory.mktemp("d") / "shapes", num_train=10, num_val=4,
                                 image_size=64, seed=2)
    xml = root / "Annotations" / "000001.xml"
    xml.write_text(xml.read_text().replace("</annotation>", EXTRA + "</annotation>"))
    return root


def assert_same_records(coco, voc, split: str) -> None:
    assert len(coco) == len(voc) > 0
    assert [r.image for r in coco] == [f"{split}/{PurePosixPath(r.image).name}" for r in voc]
    for a, b in zip(coco, voc):
        assert (a.width, a.height) == (b.width, b.height)
        for field in ("boxes", "labels", "difficult"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and x.tobytes() == y.tobytes(), field


def test_coco_export_read_back_equals_the_voc_records(voc_root, tmp_path):
    written = export_voc_to_coco(voc_root, tmp_path / "coco", ["train", "val"])
    assert written == [tmp_path / "coco/annotations/instances_train.json",
                       tmp_path / "coco/annotations/instances_val.json"]
    doc = json.loads(written[0].read_text())
    # categories in sorted order, not the class list's: read back by name, the labels agree
    assert [c["name"] for c in doc["categories"]] == sorted(CLASSES) != CLASSES
    for split in ("train", "val"):
        voc = VOCReader(voc_root, CLASSES).records(split)
        coco = COCOReader(tmp_path / "coco", CLASSES).records(split)
        assert_same_records(coco.records, voc.records, split)
        if split == "train":
            assert (voc.clipped, voc.zero_area) == (1, 1)
            assert (coco.clipped, coco.zero_area) == (0, 1)    # exported as mdk read them
            rec = coco.records[1]
            assert rec.difficult.tolist()[-4:] == [True, False, False, False]  # difficult = crowd
            assert rec.boxes[-3].tolist() == [10.5, 0.25, 33.75, 17.125]
            assert rec.boxes[-2].tolist() == [50.0, 40.0, 64.0, 60.0]
            assert rec.boxes[-1].tolist() == [9.0, 9.0, 9.0, 30.0]             # zero area
    images = sorted((tmp_path / "coco" / "train").iterdir())
    assert len(images) == 10 and all(p.is_symlink() for p in images)
    assert images[0].resolve() == (voc_root / "JPEGImages" / "000000.jpg").resolve()


def test_reader_keys_name_another_layout(voc_root, tmp_path):
    """``annotations`` and ``images`` are path patterns: any layout of the same JSON reads."""
    export_voc_to_coco(voc_root, tmp_path / "coco", ["val"], copy=True)
    moved = tmp_path / "mine"
    (moved / "labels").mkdir(parents=True)
    shutil.move(tmp_path / "coco/annotations/instances_val.json", moved / "labels/val-set.json")
    shutil.move(tmp_path / "coco/val", moved / "pictures")
    reader = COCOReader(moved, CLASSES, annotations="labels/{split}-set.json", images="pictures")
    reader.check(["val"])
    assert reader.count("val") == 4 and reader.sources("val") == [moved / "labels/val-set.json"]
    got = reader.records("val").records
    want = COCOReader(tmp_path / "coco_again", CLASSES)
    export_voc_to_coco(voc_root, tmp_path / "coco_again", ["val"])
    for a, b in zip(got, want.records("val").records):
        assert a.image == "pictures/" + PurePosixPath(b.image).name
        assert a.boxes.tobytes() == b.boxes.tobytes() and a.labels.tolist() == b.labels.tolist()


def test_voc2coco_command(voc_root, tmp_path, capsys):
    out = tmp_path / "out"
    assert voc2coco([str(voc_root), str(out), "--splits", "val", "--copy",
                     "--classes", ",".join(CLASSES)]) == 0
    assert capsys.readouterr().out.split() == [str(out / "annotations/instances_val.json")]
    doc = json.loads((out / "annotations/instances_val.json").read_text())
    assert [c["name"] for c in doc["categories"]] == CLASSES
    assert [im["file_name"] for im in doc["images"]] == [f"0000{i}.jpg" for i in range(10, 14)]
    assert not any(p.is_symlink() for p in (out / "val").iterdir())   # --copy
    assert voc2coco([str(tmp_path / "nope"), str(out)]) == 2
    assert "does not exist" in capsys.readouterr().out


def _losses(log: str) -> list[str]:
    """Every epoch's train loss, val mAP and val loss, as logged."""
    return re.findall(r"epoch \d+/\d+  (?:loss|val mAP@0.5) (\S+)(?:  val loss (\S+))?", log)


def test_dataset_coco_trains_exactly_as_its_voc_form(tmp_path):
    """The real command, twice: the built-in data (VOC layout) and its voc2coco export read with
    dataset=coco. Same records in the same order: the same batches, bit-identical weights, the
    same evaluation (a TINY run does not learn to detect yet: its val mAP is 0 on both, so the
    val loss, 3.38 here, is what shows the val splits agree)."""
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1")

    def run(name: str, *args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, str(REPO / "run.py"), *args, f"paths.checkpoints={tmp_path / name}",
                f"hydra.run.dir={tmp_path / ('run_' + name)}"]
        p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return p

    voc = run("voc", *TINY, f"paths.data={tmp_path / 'data'}")
    export_voc_to_coco(tmp_path / "data/shapes", tmp_path / "coco", ["train", "val"])
    no_generate = ["debug=tiny_model", "dataset.num_workers=0"]  # TINY without the generated data
    coco = run("coco", *no_generate, "dataset=coco", f"dataset.root={tmp_path / 'coco'}",
               "dataset.train_split=train", "dataset.val_split=val",
               f"dataset.class_names=[{','.join(CLASSES)}]", "dataset.num_classes=5",
               f"paths.data={tmp_path / 'data_coco'}")
    assert "split 'train': 48 images" in coco.stdout and "split 'val': 16 images" in coco.stdout
    assert _losses(coco.stdout) == _losses(voc.stdout) and len(_losses(voc.stdout)) == 4
    a = torch.load(tmp_path / "voc/step1/last.pth", weights_only=False)
    b = torch.load(tmp_path / "coco/step1/last.pth", weights_only=False)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["trainer"]["iter"] == b["trainer"]["iter"] == 2 * 48 // 8
    assert a["metric"] == b["metric"] and a["metric"]["loss"] > 1   # map50, loss, images, ...


def test_preflight_counts_from_a_fresh_cache_without_parsing_the_json(voc_root, tmp_path,
                                                                       monkeypatch):
    from mdk.data import coco as coco_module
    from mdk.data.build import build_datasets, check_dataset_files

    export_voc_to_coco(voc_root, tmp_path / "coco", ["train", "val"])
    d = {"name": "coco", "root": str(tmp_path / "coco"), "class_names": CLASSES,
         "num_classes": 5, "train_split": "train", "val_split": "val",
         "reader": {"_target_": "mdk.data.coco.COCOReader"}}
    assert check_dataset_files(d, tmp_path) == 10                      # no cache yet: parsed
    build_datasets(d, 64, 4, YoloV1Head(len(CLASSES), 1), 0, tmp_path / "cache")  # caches built
    loads = []
    real = coco_module.json.load
    monkeypatch.setattr(coco_module.json, "load", lambda f: loads.append(f.name) or real(f))
    assert check_dataset_files(d, tmp_path, tmp_path / "cache") == 10 and loads == []
    path = tmp_path / "coco/annotations/instances_val.json"
    path.write_text(path.read_text())                       # rewritten, same bytes: still fresh
    assert check_dataset_files(d, tmp_path, tmp_path / "cache") == 10 and loads == []
    path.write_text(path.read_text() + "\n")                           # edited: checked again
    assert check_dataset_files(d, tmp_path, tmp_path / "cache") == 10 and loads == [str(path)]
