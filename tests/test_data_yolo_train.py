"""``dataset=yolo`` trains and scores as the VOC form of the same boxes: the real command on the
built-in data and its voc2yolo export as a Roboflow folder, the whole chain (bit-identical
weights, losses and metrics), and the VOC07
mAP of the same detections against a VOC folder of odd image sizes and its YOLO export (equal to
1e-6: the YOLO fractions are rounded, the devkit's boxes are not)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO, TINY, run_cmd_env
from mdk.data.build import build_datasets
from mdk.data.shapes import SHAPE_CLASSES
from mdk.data.yolo_export import export_voc_to_yolo
from mdk.eval.metrics import evaluate_dataset
from mdk.models.heads import YoloV1Head

CLASSES = list(SHAPE_CLASSES)


def _losses(log: str) -> list[str]:
    return re.findall(r"epoch \d+/\d+  (?:loss|val mAP@0.5) (\S+)(?:  val loss (\S+))?", log)


def roboflow_folder(yolo: Path, out: Path) -> Path:
    """The YOLO export rearranged as Roboflow writes it: <split>/images and <split>/labels, the
    val split named valid, and a data.yaml beside them with ``../<split>/images`` paths."""
    for split, folder in (("train", "train"), ("val", "valid")):
        (out / folder).mkdir(parents=True)
        for kind in ("images", "labels"):
            (yolo / kind / split).rename(out / folder / kind)
    (out / "data.yaml").write_text(f"train: ../train/images\nval: ../valid/images\nnc: "
                                   f"{len(CLASSES)}\nnames: {CLASSES}\n"
                                   "roboflow:\n  workspace: w\n  project: p\n  version: 1\n")
    return out


@pytest.mark.slow
def test_a_roboflow_folder_trains_the_chain_exactly_as_its_voc_form(tmp_path):
    """The real command, the whole chain, twice: the built-in data (VOC layout) and its export
    as a Roboflow folder read with ``dataset=yolo dataset.root=<folder>`` and nothing else. Same
    records in the same order: bit-identical weights and the same evaluations at every stage (a
    tiny run learns little: step4's mAP is what shows a non-zero score agrees)."""
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1")
    chain = "pipeline=[step1,step2,cal,step3,step4]"

    def run(name: str, *args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, str(REPO / "run.py"), *args, chain,
                f"paths.checkpoints={tmp_path / name}", f"hydra.run.dir={tmp_path / ('run_' + name)}"]
        p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return p

    voc = run("voc", *TINY, f"paths.data={tmp_path / 'data'}")
    export_voc_to_yolo(tmp_path / "data/shapes", tmp_path / "yolo", class_names=CLASSES)
    folder = roboflow_folder(tmp_path / "yolo", tmp_path / "roboflow")
    # nothing typed but the folder: the class list is data.yaml's names
    yolo = run("yolo", "debug=tiny_model", "dataset.num_workers=0", "dataset=yolo",
               f"dataset.root={folder}", f"paths.data={tmp_path / 'data_yolo'}")
    assert f"dataset.class_names read from {folder}: [{', '.join(CLASSES)}]" in yolo.stdout
    assert "split 'train': 48 images" in yolo.stdout and "split 'val': 16 images" in yolo.stdout
    assert _losses(yolo.stdout) == _losses(voc.stdout) and len(_losses(voc.stdout)) > 10
    for stage in ("step1", "step2", "cal", "step3", "step4"):
        a = torch.load(tmp_path / f"voc/{stage}/best.pth", weights_only=False)
        b = torch.load(tmp_path / f"yolo/{stage}/best.pth", weights_only=False)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), stage
        assert a["metric"] == b["metric"], stage
    assert a["metric"]["map50"] > 0      # step4's: a score that is not zero agrees
    assert (tmp_path / "yolo/step4/chip_model").is_dir()


def write_voc(root: Path, sizes: list[tuple[int, int]], seed: int) -> None:
    """A VOC folder of plain images of ``sizes`` with 1-4 random integer boxes each."""
    rng = np.random.default_rng(seed)
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ids = [f"{i:06d}" for i in range(len(sizes))]
    for image_id, (w, h) in zip(ids, sizes):
        Image.new("RGB", (w, h), (90, 120, 150)).save(root / "JPEGImages" / f"{image_id}.jpg")
        objects = ""
        for _ in range(rng.integers(1, 5)):
            x1, y1 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
            x2, y2 = int(rng.integers(x1 + 4, w + 1)), int(rng.integers(y1 + 4, h + 1))
            objects += (f"<object><name>{CLASSES[rng.integers(5)]}</name><bndbox><xmin>{x1}</xmin>"
                        f"<ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>")
        (root / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><size><width>{w}</width><height>{h}</height></size>{objects}"
            "</annotation>")
    half = len(ids) // 2
    (root / "ImageSets/Main/train.txt").write_text("\n".join(ids[:half]) + "\n")
    (root / "ImageSets/Main/val.txt").write_text("\n".join(ids[half:]) + "\n")


def test_voc07_map_of_the_same_detections_is_equal(tmp_path):
    sizes = [(97, 61), (640, 480), (333, 517), (101, 101), (250, 187), (77, 300)] * 3
    write_voc(tmp_path / "voc", sizes, seed=5)
    export_voc_to_yolo(tmp_path / "voc", tmp_path / "yolo", class_names=CLASSES)
    head = YoloV1Head(len(CLASSES), 1)
    common = {"name": "x", "class_names": CLASSES, "num_classes": 5, "train_split": "train",
              "val_split": "val", "augment": False}
    _, voc = build_datasets({**common, "root": str(tmp_path / "voc")}, 64, 2, head, 0,
                            tmp_path / "cache_voc", progress=False, train=False)
    _, yolo = build_datasets({**common, "root": str(tmp_path / "yolo"),
                              "reader": {"_target_": "mdk.data.yolo.YOLOReader"}},
                             64, 2, head, 0, tmp_path / "cache_yolo", progress=False, train=False)
    assert len(voc) == len(yolo) == 9
    # detections: the objects moved by up to 1.5 px (of 64), a wrong class now and then, random scores
    rng = np.random.default_rng(0)
    detections = {}
    for i in range(len(voc)):
        boxes, labels, _ = voc.gt(i)
        boxes = boxes.numpy() + rng.uniform(-1.5, 1.5, boxes.shape)
        labels = np.where(rng.random(len(labels)) < 0.2, (labels.numpy() + 1) % 5, labels.numpy())
        detections[i] = {"boxes": boxes, "labels": labels, "scores": rng.random(len(labels))}
    for metric in ("voc07", "coco"):
        a, b = evaluate_dataset(detections, voc, metric), evaluate_dataset(detections, yolo, metric)
        assert 0.2 < a["map"] < 0.95
        assert abs(a["map"] - b["map"]) < 1e-6, (metric, a["map"], b["map"])
