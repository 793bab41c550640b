"""The evaluator on what the runner gives it: a real model's decoded predictions on the generated
shapes val split and ``dataset.gt``; the reports from the same result."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdk.engine import build
from mdk.models.build import build_model
from mdk.eval.metrics import evaluate_detections
from mdk.eval.scalars import ap_table, scalars
from mdk.eval.grid import dataset_grid
from mdk.eval.plots import pr_curve_images
from mdk.eval.distributed import predict
from helpers.devkit import devkit_ap


@pytest.fixture
def model_and_val(tiny_cfg):
    cfg = tiny_cfg("trainer.device=cpu")
    build.seed_everything(cfg.seed)  # the same untrained model whatever ran before in this process
    model = build_model(cfg)
    # Untrained, the output conv (weights ~N(0, 0.01), bias 0) gives every cell nearly the same
    # box signs, so with one box per cell all boxes can have w or h < 0 (no detection at all).
    # A box prior in the bias (centred, 0.3 x 0.3, conf 0.5) keeps the outputs the model's own,
    # input-dependent around it, and real boxes to rank.
    with torch.no_grad():
        bias = model.layers[-1].conv.bias
        for b in range(cfg.model.net.boxes_per_cell):
            bias[5 * b: 5 * b + 5] = torch.tensor([0.5, 0.5, 0.3, 0.3, 0.5])
    _, val = build.build_data(cfg, model.grid)
    return cfg, model, val


def test_real_predictions_match_the_devkit_transcription(model_and_val):
    cfg, model, val = model_and_val
    # Untrained class scores are near 0 (conf 0.5 x ~0.01 sits below the usual 0.01), so every
    # positive score is kept to give the evaluator real, ranked detections.
    dets, _, count = predict(model, val, 8, torch.device("cpu"), conf_thresh=0.0, nms_iou=0.5)
    assert count == len(val) and sum(len(d["scores"]) for d in dets.values()) > 0
    gts = {i: tuple(t.numpy() for t in val.gt(i)) for i in dets}
    plain = {i: {k: v.numpy() for k, v in d.items()} for i, d in dets.items()}
    n = cfg.dataset.num_classes
    for metric in ("voc07", "voc12"):
        r = evaluate_detections(dets, val.gt, n, metric)
        ref = [devkit_ap(plain, gts, c, metric, 0.0) for c in range(n)]
        np.testing.assert_allclose(r["ap"], ref, rtol=0, atol=1e-12, equal_nan=True)
        assert r["images"] == len(val)
    names = list(cfg.dataset.class_names)
    assert set(scalars(r, names)) >= {"map50_voc12"}
    assert all(name in ap_table(r, names) for name in names)
    grid = dataset_grid(val, dets, names, count=4, score_thresh=0.0, max_dets=3)
    assert grid.dtype == torch.uint8 and grid.shape[0] == 3
    assert len(pr_curve_images(r, names)) == (1 if not math.isnan(r["map"]) else 0)


def test_ground_truth_as_detections_scores_one(model_and_val):
    cfg, _, val = model_and_val
    dets = {}
    for i in range(len(val)):
        boxes, labels, _ = val.gt(i)
        dets[i] = {"boxes": boxes, "scores": torch.ones(len(labels)), "labels": labels}
    for metric in ("voc07", "voc12"):
        r = evaluate_detections(dets, val.gt, cfg.dataset.num_classes, metric)
        present = r["num_gt"] > 0
        assert present.any() and (r["ap"][present] == 1.0).all() and r["map"] == 1.0
