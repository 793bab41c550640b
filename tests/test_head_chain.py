"""head=anchors through the whole chain: the exported chip model records its head, and the tools
read a chip model with it even when the command names another head."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import TINY, compose
from mdk.engine.runner import run_stage
from mdk.stage import config_for_stage
from mdk.tools import evaluate

pytestmark = pytest.mark.slow  # a tiny chain, ~20 s on 2 cores
ANCHORS = ["head=anchors", "head.anchors=[[0.3,0.3]]", "head.neighbours=false"]


def test_anchor_head_chain_exports_its_head_and_the_tools_read_it(tmp_path, shared_data):
    torch.set_num_threads(1)
    common = [*TINY, f"paths.data={shared_data}", f"paths.checkpoints={tmp_path}/ckpt",
              "dataset.augment=false"]
    for s in ("step1", "step2", "cal", "step3", "step4"):
        epochs = "trainer.epochs=6" if s == "step1" else "trainer.epochs=1"
        res = run_stage(config_for_stage(compose([*common, *ANCHORS, epochs]), s), tmp_path / "run")
        assert res.best_map50 is not None
    chip = tmp_path / "ckpt" / "step4" / "chip_model"
    meta = json.loads((chip / "chip_model.json").read_text())["meta"]
    assert meta["head"] == {"_target_": "mdk.models.heads.AnchorHead", "num_classes": 5,
                            "anchors": [[0.3, 0.3]], "size_range": 6.0, "match_ratio": 4.0,
                            "neighbours": False}
    assert json.loads((chip / "chip_model.json").read_text())["layers"][-1]["out_channels"] == 10
    fake = evaluate.evaluate_path(tmp_path / "ckpt" / "step4" / "best.pth", [*common, *ANCHORS])
    # a checkpoint brings its own head and loss too
    assert evaluate.evaluate_path(tmp_path / "ckpt" / "step4" / "best.pth", common)["map50"] \
        == fake["map50"]
    # the chip model's own head wins over the command's default head=yolov1
    integer = evaluate.evaluate_path(chip, common)
    assert (integer["map50"], integer["ap"]) == (fake["map50"], fake["ap"])
