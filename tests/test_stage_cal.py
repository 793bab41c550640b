"""The cal stage through the engine: one pass, nothing trains, caps are what the method says."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mdk.stage import config_for_stage
from mdk.checkpoint.files import load_checkpoint
from mdk.data.dataset import DetectionDataset
from mdk.engine.runner import run_stage
from mdk.quant.bn_fold import chip_layers
from mdk.tools.evaluate import load_checkpoint_model


@pytest.fixture
def step2_ready(tiny_cfg, tmp_path):
    """step1 and step2 (two batches each) in tmp_path: cal's input exists."""
    for s in ("step1", "step2"):
        cfg = tiny_cfg("trainer.epochs=1", "trainer.limit_train_batches=2")
        run_stage(config_for_stage(cfg, s), tmp_path / "run")
    return Path(tiny_cfg().paths.checkpoints)


def test_cal_is_one_pass_without_optimizer_whatever_epochs_says(tiny_cfg, step2_ready, tmp_path,
                                                              monkeypatch):
    seen: Counter = Counter()
    steps: list = []
    orig_getitem = DetectionDataset.__getitem__

    def counting_getitem(self, index):
        if self.split == "train":
            seen[int(index)] += 1
        return orig_getitem(self, index)

    def no_step(self, *a, **k):
        steps.append(type(self).__name__)

    monkeypatch.setattr(DetectionDataset, "__getitem__", counting_getitem)
    monkeypatch.setattr(torch.optim.Optimizer, "step", no_step)
    monkeypatch.setattr(torch.optim.AdamW, "step", no_step)
    res = run_stage(config_for_stage(tiny_cfg("trainer.epochs=5"), "cal"), tmp_path / "run")
    # every one of the 48 training images exactly once: one pass, not trainer.epochs=5 passes
    assert sorted(seen) == list(range(48)) and set(seen.values()) == {1}
    assert steps == []
    cal = load_checkpoint(step2_ready / "cal" / "best.pth")
    s2 = load_checkpoint(step2_ready / "step2" / "best.pth")
    # no training state: nothing to resume, the result is final
    assert cal["stage"] == "cal" and cal["finished"] and "trainer" not in cal and "optimizer" not in cal
    # weights unchanged: every tensor but the caps is step2's, bit for bit
    assert set(cal["model"]) == set(s2["model"])
    for k, v in s2["model"].items():
        if k.endswith(".cap"):
            assert float(v) == 0.0 and float(cal["model"][k]) > 0, k
        else:
            assert torch.equal(v, cal["model"][k]), k
    assert res.caps == pytest.approx([float(cal["model"][f"layers.{i}.cap"])
                                      for i in range(len(res.caps))])


def test_cal_max_caps_equal_the_max_of_the_conv_outputs(tiny_cfg, step2_ready, tmp_path):
    cfg = tiny_cfg("step=cal", "step/calibration=max")
    res = run_stage(config_for_stage(cfg, "cal"), tmp_path / "run")
    # Independent reference: the step2 model (quantized weights, float activations) on every
    # un-augmented training image; each layer's conv output = F.conv2d(its input, quantized W, b).
    loaded = load_checkpoint_model(step2_ready / "step2" / "best.pth", _overrides(cfg))
    model = loaded.model
    layers = chip_layers(model)
    tops = [float("-inf")] * len(layers)

    def hook(i):
        def fn(layer, inputs):
            w, b = layer.effective_weight_bias()
            tops[i] = max(tops[i], float(F.conv2d(inputs[0], w, b, padding=1).max()))
        return fn

    handles = [layer.register_forward_pre_hook(hook(i)) for i, layer in enumerate(layers)]
    from mdk.engine.build import build_data

    train, _ = build_data(loaded.cfg, model.grid)
    with torch.no_grad():
        for start in range(0, len(train), 8):  # the cal batches: global batch 8, in order
            model(torch.stack([train.image(i) for i in range(start, min(start + 8, len(train)))]))
    for h in handles:
        h.remove()
    assert all(t > 0 for t in tops)
    assert res.caps == pytest.approx(tops, rel=1e-6)
    saved = json.loads((step2_ready / "cal" / "caps.json").read_text())
    assert saved["meta"]["method"] == "mdk.quant.calibrate.MaxCap" and saved["meta"]["batches"] == 6
    assert [layer["cap"] for layer in saved["layers"]] == pytest.approx(tops, rel=1e-6)


def _overrides(cfg) -> list[str]:
    """The tiny_cfg overrides as a list (the tool composes the config itself)."""
    from conftest import TINY

    return [*TINY, f"paths.data={cfg.paths.data}", f"paths.checkpoints={cfg.paths.checkpoints}"]
