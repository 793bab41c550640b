"""Reports: PR-curve PNGs per class group, the detection grid image, the AP table."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mdk.eval.scalars import ap_table
from mdk.eval.voc_ap import voc_ap
from mdk.eval.grid import (DET_COLOR, DIFFICULT_COLOR, GT_COLOR, dataset_grid, detection_grid,
                           save_png)
from mdk.eval.plots import pr_curve_images, save_pr_curves
from helpers.reports import _result, read_png


def test_pr_curves_one_png_per_group_of_classes(tmp_path):
    r = _result()
    names = [f"class{c}" for c in range(13)]
    paths = save_pr_curves(r, tmp_path, names, stem="pr_step1", per_figure=10, title="step1")
    # 12 classes with ground truth (the 13th is nan and left out): groups of 10 and 2.
    assert [p.name for p in paths] == ["pr_step1_1.png", "pr_step1_2.png"]
    for p in paths:
        img = read_png(p)
        assert img.dtype == torch.uint8 and img.shape == (3, 480, 640)
        assert len(torch.unique(img.reshape(3, -1), dim=1).T) > 20   # curves, legend, text drawn
    imgs = pr_curve_images(r, names, per_figure=5)
    assert len(imgs) == 3 and all(i.shape == (3, 480, 640) for i in imgs)


def test_pr_curves_of_nothing_write_nothing(tmp_path):
    r = voc_ap({0: {"boxes": np.zeros((0, 4)), "scores": [], "labels": []}},
               {0: (np.zeros((0, 4)), [], [])}, 3)
    assert save_pr_curves(r, tmp_path) == []


def test_detection_grid_draws_ground_truth_and_detections():
    images = torch.zeros(2, 3, 64, 64, dtype=torch.uint8)
    dets = [{"boxes": torch.tensor([[8.0, 40, 24, 56], [40, 40, 50, 50]]),
             "scores": torch.tensor([0.9, 0.1]), "labels": torch.tensor([1, 0])},
            {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0)}]
    gts = [(torch.tensor([[8.0, 8, 24, 24]]), torch.tensor([0]), torch.tensor([False])),
           (torch.tensor([[8.0, 8, 24, 24]]), torch.tensor([0]), torch.tensor([True]))]
    g = detection_grid(images, dets, gts, ["cat", "dog"], score_thresh=0.3, nrow=2)
    # 64-px images are drawn 4x (min_size 256); tiles at offset 4 with 4-px padding.
    assert g.dtype == torch.uint8 and g.shape == (3, 256 + 8, 2 * 256 + 12)
    tile0, tile1 = g[:, 4:260, 4:260], g[:, 4:260, 264:520]
    assert tile0[:, 60, 32].tolist() == list(GT_COLOR)          # left edge of the GT box
    assert tile1[:, 60, 32].tolist() == list(DIFFICULT_COLOR)    # difficult GT in yellow
    assert tile0[:, 200, 32].tolist() == list(DET_COLOR)         # left edge of the 0.9 detection
    # The 0.1 detection is under score_thresh: nothing drawn at its edge (x=160, y=180).
    assert tile0[:, 180, 160].tolist() == [0, 0, 0]
    # Its label "dog 0.90" is drawn inside the box's top-left corner: a red background (green
    # channel 40) with white text (green channel high).
    label_area = tile0[:, 160:172, 34:70]
    assert (label_area[1] == DET_COLOR[1]).float().mean() > 0.5 and (label_area[1] > 200).any()


def test_detection_grid_input_errors():
    img = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    d = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0)}
    with pytest.raises(ValueError, match="1 images, 2 detections"):
        detection_grid(img, [d, d], [(torch.zeros(0, 4), [])], ["a"])
    with pytest.raises(ValueError, match="uint8"):
        detection_grid(img.float(), [d], [(torch.zeros(0, 4), [])], ["a"])


def test_dataset_grid_reads_the_dataset_and_saves_png(tmp_path):
    class Data:
        def image(self, i):
            return torch.full((3, 32, 32), 10 * i, dtype=torch.uint8)

        def gt(self, i):
            return torch.tensor([[4.0, 4, 20, 20]]), torch.tensor([0]), torch.tensor([False])

    dets = {i: {"boxes": torch.tensor([[4.0, 4, 20, 20]]), "scores": torch.tensor([0.8]),
                "labels": torch.tensor([0])} for i in (7, 3, 5, 9)}
    g = dataset_grid(Data(), dets, ["a"], count=3, min_size=32)
    assert g.shape == (3, 32 + 8, 3 * 32 + 16)
    assert g[:, 4 + 28, 4 + 28].tolist() == [30, 30, 30]  # first tile: image 3 (lowest index)
    assert g[:, 4 + 28, 40 + 28].tolist() == [50, 50, 50]
    p = save_png(g, tmp_path / "grids" / "val_3.png")
    assert torch.equal(read_png(p), g)


def test_ap_table_lists_every_class_and_the_mean():
    r = _result(classes=4)
    text = ap_table(r, ["a", "b", "c", "d"])
    lines = text.splitlines()
    assert lines[0] == "VOC07 11-point mAP@0.5 over 40 images"
    rows = {ln.split("|")[1].strip(): ln for ln in lines if ln.startswith("| ")}
    assert set(rows) == {"class", "a", "b", "c", "d", "**mean**"}
    assert "n/a" in rows["d"] and f"{r['ap'][0]:.4f}" in rows["a"]
    assert f"{r['map']:.4f}" in rows["**mean**"]
