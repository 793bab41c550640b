"""VOC AP under the default box rule (``eval.box_rule=devkit``) against a reference written here
from the devkit's published rules, on real-sized images resized to the model input.

The reference knows nothing of mdk: it reads the annotation XML itself (integer, 1-based inclusive
pixels), takes detections in original pixels (the model's boxes scaled back by width/image_size
and height/image_size, as detectron2 writes its results files), and scores one class per call,
detection by detection, as ``VOCevaldet.m`` does (stable sort by score; the highest-overlap object
of the class, overlap with the +1 on widths and heights; >= 0.5 with a difficult object: ignored;
a second hit on an object: false positive), with the ports' 11 thresholds ``k * 0.1`` (voc07) or
``VOCap.m``'s envelope area (voc12)."""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from conftest import compose
from launchers.processes.spawn import run_ranks
from mdk.data.dataset import DetectionDataset
from mdk.models.heads import YoloV1Head
from mdk.data.voc import VOCReader
from mdk.eval.distributed import evaluate
from mdk.eval.metrics import evaluate_dataset, evaluate_detections
from mdk.world import World
from helpers.ddp import Oracle, eval_rank

CLASSES = ["cat", "dog", "person", "car", "bird"]
SIZES = [(500, 375), (333, 500), (375, 500), (500, 333), (480, 360), (353, 500)]
MODEL_INPUT = 192  # the model input: every image is resized to it, with its own x and y factors


def write_voc(root: Path, images: int, seed: int) -> Path:
    """A VOC folder of noise images of real VOC sizes, 1..5 objects each with integer 1-based
    boxes (small and large, some difficult, some touching the right/bottom border)."""
    rng = np.random.default_rng(seed)
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ids = []
    for k in range(images):
        image_id = f"{k:06d}"
        w, h = SIZES[k % len(SIZES)]
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
            root / "JPEGImages" / f"{image_id}.jpg")
        ann = ET.Element("annotation")
        size = ET.SubElement(ann, "size")
        for tag, v in (("width", w), ("height", h), ("depth", 3)):
            ET.SubElement(size, tag).text = str(v)
        for j in range(int(rng.integers(1, 6))):
            bw = int(rng.integers(6, 40) if rng.random() < 0.4 else rng.integers(40, w // 2))
            bh = int(rng.integers(6, 40) if rng.random() < 0.4 else rng.integers(40, h // 2))
            x1, y1 = int(rng.integers(1, w - bw + 1)), int(rng.integers(1, h - bh + 1))
            if j == 0 and k % 4 == 0:
                x1, y1 = w - bw + 1, h - bh + 1     # xmax == width, ymax == height
            obj = ET.SubElement(ann, "object")
            ET.SubElement(obj, "name").text = CLASSES[(k + j) % len(CLASSES)]
            ET.SubElement(obj, "difficult").text = "1" if rng.random() < 0.15 else "0"
            bb = ET.SubElement(obj, "bndbox")
            for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), (x1, y1, x1 + bw - 1, y1 + bh - 1)):
                ET.SubElement(bb, tag).text = str(v)
        ET.ElementTree(ann).write(root / "Annotations" / f"{image_id}.xml")
        ids.append(image_id)
    for split in ("train", "val"):
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return root


def read_annotations(root: Path, ids: list[str]) -> dict[str, list[dict]]:
    """The reference's own reading of the XML: per image its objects, integer boxes as written."""
    out = {}
    for image_id in ids:
        tree = ET.parse(root / "Annotations" / f"{image_id}.xml")
        out[image_id] = [{"name": o.find("name").text,
                          "difficult": int(o.find("difficult").text) == 1,
                          "bbox": [int(o.find("bndbox").find(t).text)
                                   for t in ("xmin", "ymin", "xmax", "ymax")]}
                         for o in tree.findall("object")]
    return out


def devkit_class_ap(results: list[tuple], annotations: dict[str, list[dict]], classname: str,
                    use_07: bool) -> float:
    """One class: ``results`` rows ``(image_id, score, x1, y1, x2, y2)`` in original pixels, in
    results-file order (images ascending, then the order within an image)."""
    objects = {i: [o for o in objs if o["name"] == classname] for i, objs in annotations.items()}
    taken = {i: [False] * len(objs) for i, objs in objects.items()}
    npos = sum(not o["difficult"] for objs in objects.values() for o in objs)
    rows = sorted(results, key=lambda r: -r[1])          # Python's sort is stable, as MATLAB's
    tp, fp = np.zeros(len(rows)), np.zeros(len(rows))
    for d, (image_id, _, *bb) in enumerate(rows):
        ovmax, jmax = -math.inf, -1
        for j, o in enumerate(objects[image_id]):
            bg = o["bbox"]
            iw = min(bb[2], bg[2]) - max(bb[0], bg[0]) + 1
            ih = min(bb[3], bg[3]) - max(bb[1], bg[1]) + 1
            if iw > 0 and ih > 0:
                ua = ((bb[2] - bb[0] + 1) * (bb[3] - bb[1] + 1)
                      + (bg[2] - bg[0] + 1) * (bg[3] - bg[1] + 1) - iw * ih)
                if iw * ih / ua > ovmax:
                    ovmax, jmax = iw * ih / ua, j
        if ovmax >= 0.5:
            if not objects[image_id][jmax]["difficult"]:
                if not taken[image_id][jmax]:
                    tp[d], taken[image_id][jmax] = 1, True
                else:
                    fp[d] = 1
        else:
            fp[d] = 1
    assert npos > 0, "the reference sets give every class ground truth"
    tp, fp = np.cumsum(tp), np.cumsum(fp)
    rec = tp / npos
    prec = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    if use_07:
        ap = 0.0
        for t in [k * 0.1 for k in range(11)]:          # np.arange(0.0, 1.1, 0.1)
            ap += (prec[rec >= t].max() if (rec >= t).any() else 0.0) / 11
        return ap
    mrec = np.concatenate([[0.0], rec, [1.0]])
    mpre = np.concatenate([[0.0], prec, [0.0]])
    for k in range(len(mpre) - 2, -1, -1):
        mpre[k] = max(mpre[k], mpre[k + 1])
    return float(sum((mrec[k] - mrec[k - 1]) * mpre[k] for k in range(1, len(mrec))
                     if mrec[k] != mrec[k - 1]))


def devkit_map(detections: dict, ds: DetectionDataset, root: Path, use_07: bool) -> list[float]:
    """Per-class AP of model-input ``detections`` of ``ds``: the reference maps each box to its
    image's original pixels and reads the ground truth from the XML."""
    ids = [Path(r.image).stem for r in ds.records]
    annotations = read_annotations(root, ids)
    results: dict[str, list] = {c: [] for c in CLASSES}
    for i in sorted(detections):
        with Image.open(root / ds.records[i].image) as im:
            w, h = im.size
        for box, score, label in zip(*(np.asarray(detections[i][k], np.float64)
                                       for k in ("boxes", "scores", "labels"))):
            sx, sy = w / MODEL_INPUT, h / MODEL_INPUT
            results[CLASSES[int(label)]].append((ids[i], float(score), box[0] * sx, box[1] * sy,
                                                 box[2] * sx, box[3] * sy))
    return [devkit_class_ap(results[c], annotations, c, use_07) for c in CLASSES]


def dataset(root: Path, tmp: Path) -> DetectionDataset:
    records = VOCReader(root, CLASSES).records("val").records
    return DetectionDataset(root, "val", records, CLASSES, MODEL_INPUT, grid=6, head=YoloV1Head(len(CLASSES), 2),
                            augment=False, meta_dir=tmp / "meta")


def boundary_shifts(width: np.ndarray, scale: float) -> np.ndarray:
    """Horizontal shifts (original pixels) of a copy of objects ``width`` = xmax - xmin wide
    whose IoU lands between the rules: a copy shifted by dx has IoU (w - dx) / (w + dx) without
    the +1 and (w + 1 - dx) / (w + 1 + dx) with it, 0.5 at dx = w / 3 and (w + 1) / 3. The first
    shift is a miss without the +1 and a hit with the devkit's; the second a miss for the devkit
    and a hit with a +1 taken in the model frame (1 / ``scale`` original pixels)."""
    return np.stack([width / 3 + 1 / 6, (width + 1) / 3 + (1 / scale - 1) / 6], 1)


def synthetic_detections(ds: DetectionDataset, seed: int) -> dict:
    """Model-input detections (float32, as the decoder gives them) near the objects (hits, near
    misses, duplicates, wrong classes), copies shifted to IoU 0.5 under one rule and not under
    another, and a few on nothing; distinct random scores."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(len(ds)):
        boxes, labels, _ = (t.numpy() for t in ds.gt(i))
        k = rng.integers(0, len(boxes), int(rng.integers(0, 3 * len(boxes) + 1)))
        wh = boxes[k, 2:] - boxes[k, :2]
        b = boxes[k] + rng.normal(0, 0.12, (len(k), 4)) * np.concatenate([wh, wh], 1)
        lab = np.where(rng.random(len(k)) < 0.9, labels[k], rng.integers(0, len(CLASSES), len(k)))
        original = ds.gt_original(i)[0].numpy().astype(np.float64)
        scale = MODEL_INPUT / ds.original_size(i)[0]
        dx = boundary_shifts(original[:, 2] - original[:, 0], scale) * scale   # model pixels
        for col in range(2):
            shifted = boxes + np.stack([dx[:, col], 0 * dx[:, col]] * 2, 1)
            b, lab = np.concatenate([b, shifted]), np.concatenate([lab, labels])
        xy = rng.uniform(0, MODEL_INPUT - 8, (2, 2))
        b = np.concatenate([b, np.concatenate([xy, xy + rng.uniform(2, 8, (2, 2))], 1)])
        lab = np.concatenate([lab, rng.integers(0, len(CLASSES), 2)])
        out[i] = {"boxes": torch.tensor(b, dtype=torch.float32),
                  "scores": torch.tensor(rng.random(len(b)), dtype=torch.float32),
                  "labels": torch.tensor(lab)}
    return out


@pytest.fixture(scope="module")
def real_sized(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("voc_real_sized")
    root = write_voc(tmp / "VOC", images=24, seed=0)
    return root, dataset(root, tmp)


def test_the_dataset_keeps_the_original_pixels_for_evaluation(real_sized):
    root, ds = real_sized
    annotations = read_annotations(root, [Path(r.image).stem for r in ds.records])
    for i, r in enumerate(ds.records):
        w, h = ds.original_size(i)
        with Image.open(root / r.image) as im:
            assert (w, h) == im.size and (w, h) in SIZES
        boxes, labels, difficult = ds.gt_original(i)
        objs = annotations[Path(r.image).stem]
        assert boxes.tolist() == [o["bbox"] for o in objs]          # as written, 1-based
        assert difficult.tolist() == [o["difficult"] for o in objs]
        scale = torch.tensor([MODEL_INPUT / w, MODEL_INPUT / h] * 2)
        torch.testing.assert_close(ds.gt(i)[0], boxes * scale)        # training's frame
        assert torch.equal(ds.gt(i)[1], labels)
    assert any(b[2] == ds.original_size(i)[0] for i in range(len(ds))
               for b in ds.gt_original(i)[0].tolist())   # an object touches the border


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("metric", ["voc07", "voc12"])
def test_devkit_rule_equals_the_devkit_on_original_size_images(real_sized, metric, seed):
    root, ds = real_sized
    dets = synthetic_detections(ds, seed)
    r = evaluate_dataset(dets, ds, metric, "devkit")
    ref = devkit_map(dets, ds, root, metric == "voc07")
    np.testing.assert_allclose(r["ap"], ref, rtol=0, atol=1e-9)
    assert abs(r["map"] - float(np.mean(ref))) <= 1e-9
    assert r["name"] == ("VOC07 11-point mAP@0.5" if metric == "voc07" else "VOC12 area mAP@0.5")
    # The rule is what makes them equal: in the model-input frame, with or without the +1, some
    # detections change from hit to miss (the curves differ).
    cont = evaluate_dataset(dets, ds, metric, "continuous")
    assert cont["name"].endswith("(continuous boxes)")
    plus1_in_model_frame = evaluate_detections(dets, ds.gt, len(CLASSES), metric, pixel_offset=1)
    for other in (cont, plus1_in_model_frame):
        assert any(not np.array_equal(a, b) for a, b in zip(other["precision"], r["precision"]))


@pytest.mark.parametrize("metric", ["voc07", "voc12"])
def test_evaluate_scores_a_models_detections_as_the_devkit(real_sized, metric):
    """The whole evaluation: images resized to the model input, a model's decoded detections
    (an oracle: jittered encoded ground truth), the metric of ``evaluate``."""
    root, ds = real_sized
    keep: list = []
    res = evaluate(Oracle(ds), ds, 8, torch.device("cpu"), 0.01, 0.5, metric=metric, keep=keep)
    result, merged = keep
    assert res["images"] == len(ds) and sum(len(d["scores"]) for d in merged.values()) > 0
    ref = devkit_map(merged, ds, root, metric == "voc07")
    np.testing.assert_allclose(result["ap"], ref, rtol=0, atol=1e-9)
    assert abs(res["map50"] - float(np.mean(ref))) <= 1e-9 and 0.05 < res["map50"] < 1.0
    cont = evaluate(Oracle(ds), ds, 8, torch.device("cpu"), 0.01, 0.5, metric=metric,
                    box_rule="continuous")
    assert cont["metric"].endswith("(continuous boxes)") and cont["map50"] != res["map50"]


def test_two_processes_score_real_sized_images_as_one(tmp_path):
    """Exact under DDP with the devkit rule: each rank predicts its shard, the union is mapped to
    original pixels once, so 1 and 2 processes give the same numbers (an odd split: 23 images)."""
    root = write_voc(tmp_path / "VOC", images=23, seed=1)

    def cfg(*extra: str):
        c = compose(["debug=tiny_model", "trainer.epochs=1", "trainer.limit_train_batches=3",
                     "dataset=voc", f"dataset.root={root}",
                     f"dataset.class_names=[{','.join(CLASSES)}]", "dataset.num_classes=5",
                     "dataset.train_split=train", "dataset.val_split=val", "dataset.num_workers=0",
                     f"paths.data={tmp_path}/data", f"paths.checkpoints={tmp_path}/ck", *extra])
        return OmegaConf.create(OmegaConf.to_container(c, resolve=True))

    single = eval_rank(cfg(), tmp_path, World())
    (tmp_path / "run").mkdir()
    multi = run_ranks(cfg("dist.gpus=2"), tmp_path / "run", eval_rank)
    assert multi["world"] == 2 and single["metrics"]["images"] == multi["metrics"]["images"] == 23
    assert multi["metrics"] == single["metrics"] and multi["oracle"] == single["oracle"]
    assert single["oracle"]["metric"] == "VOC07 11-point mAP@0.5"
    assert 0.05 < single["oracle"]["map50"] < 1.0
