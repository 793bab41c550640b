"""The whole chain step1 -> step4 on the tiny config, in one process, plus the export check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mdk.stage import config_for_stage
from mdk.checkpoint.files import load_checkpoint
from mdk.engine.runner import run_stage
from mdk.errors import MissingStageInput


def test_stage_without_its_input_says_what_to_run_first(tiny_cfg, tmp_path):
    with pytest.raises(MissingStageInput, match="step=step1"):
        run_stage(tiny_cfg("step=step2"), tmp_path)


@pytest.mark.slow
def test_full_chain_runs_and_exports_a_bit_exact_chip_model(tiny_cfg, tmp_path):
    base = tiny_cfg("trainer.limit_train_batches=3", "trainer.epochs=1")
    results = {s: run_stage(config_for_stage(base, s), tmp_path)
               for s in ("step1", "step2", "cal", "step3", "step4")}
    root = Path(base.paths.checkpoints)
    for s in ("step1", "step2", "cal", "step3", "step4"):
        assert (root / s / "best.pth").is_file(), s
    cal = load_checkpoint(root / "cal" / "best.pth")
    caps = json.loads((root / "cal" / "caps.json").read_text())
    assert [l["cap"] for l in caps["layers"]] == pytest.approx(cal["caps"])
    assert all(c > 0 for c in cal["caps"])
    # cal trains nothing: its weights are step2's best.
    s2 = load_checkpoint(root / "step2" / "best.pth")["model"]
    assert all(torch.equal(s2[k], cal["model"][k]) for k in s2 if k in cal["model"] and "cap" not in k)
    s4 = load_checkpoint(root / "step4" / "best.pth")
    caps4 = [v.item() for k, v in s4["model"].items() if k.endswith(".cap")]
    assert caps4 and all(c == 31.0 for c in caps4)
    export = Path(results["step4"].export)
    assert (export / "chip_model.json").is_file() and (export / "model.onnx").is_file()
    assert json.loads((export / "chip_model.json").read_text())["simulation_only"] is True
    assert not (export / "gti").exists()  # no GTI hand-off for a size the chip cannot run
