"""The quantization report (``python -m mdk.tools.quant_report``, mdk/insight/) on a tiny chain.

The chain is tests/chain_fixture.py's (step1 fits the 48 training images; the report scores the
train split as its val split, so its mAP is far from 0 and a change in it means something).
A planted defect (one layer's cap divided by 4 in a copy of step3's best.pth) must come out
first by activation SQNR and by sensitivity; 1 and 2 processes must write the same JSON. The
per-layer part quantizes step1's weights at step3's widths and caps; without step1 it is left out.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from chain_fixture import STAGES
from conftest import REPO, TINY, compose, run_cmd_env
from helpers.events import read_events
from mdk.checkpoint.files import load_checkpoint, save_checkpoint
from mdk.engine.runner import run_stage
from mdk.errors import ConfigError
from mdk.models.build import build_model
from mdk.stage import config_for_stage

REPORT = "quant_report"
LAYER_KEYS = {"index": int, "mask_bits": int, "shift": int, "cap": float,
              "weight_sqnr_db": float, "act_sqnr_db_isolated": float,
              "act_sqnr_db_cumulative": float, "clipped_fraction": float,
              "sensitivity_map": float, "sensitivity_loss": float, "left_float_map": float,
              "left_float_loss": float, "rank": int}
DEFECT = 2  # the layer whose cap the planted defect divides by 4
pytestmark = pytest.mark.slow  # the module's chain and reports take ~1-2 min on 2 cores


@pytest.fixture(scope="module")
def chain(fitted_chain):
    # the report scores the 48 images the chain fits (their mAP is far from 0)
    return {**fitted_chain, "overrides": [*fitted_chain["overrides"], "dataset.val_split=train"]}


def _report(overrides: list[str], run_dir: Path) -> dict:
    cfg = compose([*overrides, f"step={REPORT}"])
    res = run_stage(config_for_stage(cfg, REPORT), run_dir)
    assert res.extra["report"] == str(run_dir / "quant_report.json")
    return json.loads((run_dir / "quant_report.json").read_text())


@pytest.fixture(scope="module")
def report(chain, tmp_path_factory):
    run = tmp_path_factory.mktemp("qr_run")
    return _report(chain["overrides"], run), run


def test_report_keys_types_and_waterfall(report, chain):
    rep, run = report
    assert [s["stage"] for s in rep["stages"]] == [*STAGES, "integer"]
    for s in rep["stages"]:
        assert isinstance(s["map"], float) and isinstance(s["loss"], float)
    by = {s["stage"]: s for s in rep["stages"]}
    # the waterfall is each checkpoint in its evaluation mode, as mdk.tools.evaluate scores it
    assert (by["integer"]["map"], by["integer"]["loss"]) == (by["step4"]["map"], by["step4"]["loss"])
    assert by["step1"]["map"] > 0.3  # a real detector, so the differences below mean something
    assert rep["subject"] == "step3" and rep["weights"] == "step1"
    assert rep["per_layer_missing"] is None and rep["waterfall_images"] == 48
    assert rep["sensitivity_images"] == 48 and rep["split"] == "train"
    # the float reference on all 48 images is step1's own evaluation, BN folded (rounding only)
    assert rep["float"]["loss"] == pytest.approx(by["step1"]["loss"], rel=1e-4)
    assert rep["float"]["map"] == pytest.approx(by["step1"]["map"], abs=2e-3)
    # step1's weights quantized before fine-tuning: below the float model, far above zero
    assert 0.05 < rep["quantized"]["map"] < rep["float"]["map"]
    assert [d["index"] for d in rep["layers"]] == list(range(7))
    for d in rep["layers"]:
        assert set(d) == set(LAYER_KEYS)
        for k, t in LAYER_KEYS.items():
            assert isinstance(d[k], t), (k, d[k])
    assert sorted(rep["ranking"]) == list(range(7))
    assert [rep["layers"][i]["rank"] for i in rep["ranking"]] == list(range(1, 8))
    for name in ("quant_report.png", "quant_report.txt"):
        assert (run / name).stat().st_size > 1000
    assert (run / "quant_report.txt").read_text().count("\n") >= 6 + 2 + 7


def test_numbers_are_sane(report):
    rep, _ = report
    layers = rep["layers"]
    w = [d["weight_sqnr_db"] for d in layers]
    # 8-bit mantissas: ~6 dB per bit (3-bit against 8-bit: tests/test_insight.py)
    assert all(math.isfinite(v) and 25 < v < 60 for v in w)
    assert [d["mask_bits"] for d in layers] == [8] * 7
    assert all(0 <= d["shift"] <= 12 for d in layers)
    assert all(0.0 <= d["clipped_fraction"] < 0.2 for d in layers)
    # the first layer sees the same input in both models: its two activation SQNRs are one number
    assert layers[0]["act_sqnr_db_isolated"] == layers[0]["act_sqnr_db_cumulative"]
    assert all(d["act_sqnr_db_isolated"] > 5 for d in layers)  # 5-bit levels at a fitted cap


def _planted_copy(src: Path, dst: Path, stages: tuple[str, ...]) -> None:
    for s in stages:
        shutil.copytree(src / s, dst / s)
    ck = load_checkpoint(dst / "step3" / "best.pth")
    ck["model"][f"layers.{DEFECT}.cap"] = ck["model"][f"layers.{DEFECT}.cap"] / 4
    save_checkpoint(ck, dst / "step3" / "best.pth")


def _without_checkpoints(chain: dict) -> list[str]:
    return [o for o in chain["overrides"] if not o.startswith("paths.checkpoints=")]


def test_a_planted_defect_is_ranked_first_and_a_missing_stage_is_skipped(chain, tmp_path):
    ck = tmp_path / "ck"
    _planted_copy(chain["ckpt"], ck, ("step1", "cal", "step3"))  # no step2, step4: not listed
    rep = _report([*_without_checkpoints(chain), f"paths.checkpoints={ck}", "logger=tensorboard"],
                  tmp_path / "run")
    assert [s["stage"] for s in rep["stages"]] == ["step1", "cal", "step3"]
    layers = rep["layers"]
    assert rep["ranking"][0] == DEFECT
    iso = [d["act_sqnr_db_isolated"] for d in layers]
    assert min(range(7), key=lambda i: iso[i]) == DEFECT
    assert layers[DEFECT]["clipped_fraction"] == max(d["clipped_fraction"] for d in layers)
    assert layers[DEFECT]["sensitivity_map"] > 0.05
    # with the TensorBoard logger on, the numbers (x: the layer) and the figure are there too
    ea = read_events(tmp_path / "run" / "tensorboard" / REPORT)
    iso_tb = [(e.step, e.value) for e in ea.Scalars("quant_report/act_sqnr_db_isolated")]
    assert iso_tb == [(i, pytest.approx(v, rel=1e-6)) for i, v in enumerate(iso)]
    assert "quant_report/figure" in ea.Tags()["images"]


def test_without_a_float_stage_the_report_has_no_per_layer_part(chain, tmp_path):
    ck = tmp_path / "ck"
    for s in ("cal", "step3"):
        shutil.copytree(chain["ckpt"] / s, ck / s)
    rep = _report([*_without_checkpoints(chain), f"paths.checkpoints={ck}"], tmp_path / "run")
    assert [s["stage"] for s in rep["stages"]] == ["cal", "step3"]
    assert rep["layers"] == [] and rep["ranking"] == [] and rep["weights"] is None
    assert "step1's best.pth" in rep["per_layer_missing"]
    assert "no per-layer part: no float stage checkpoint" in (tmp_path / "run" /
                                                              "quant_report.txt").read_text()


def test_one_and_two_processes_write_the_same_json(chain, tmp_path):
    out = []
    for n in (1, 2):
        run = tmp_path / f"run{n}"
        p = subprocess.run(
            [sys.executable, "-m", "mdk.tools.quant_report", *chain["overrides"],
             f"dist.gpus={n}", "dist.cpu_threads=1", f"hydra.run.dir={run}",
             "step.report.sensitivity_images=20"],
            cwd=REPO, env=run_cmd_env(), capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "rank" in p.stdout and "integer" in p.stdout  # the table, on stdout
        out.append((run / "quant_report.json").read_text())
    assert out[0] == out[1]
    rep = json.loads(out[0])
    assert rep["sensitivity_images"] == 20 and len(rep["layers"]) == 7


def test_a_float_stage_of_another_network_is_one_config_error(chain, tmp_path):
    ck = tmp_path / "ck"
    for s in ("step1", "cal", "step3"):
        shutil.copytree(chain["ckpt"] / s, ck / s)
    # step1 of another chain: 16 channels in the first layer
    saved = load_checkpoint(ck / "step1" / "best.pth")
    other = compose([*TINY, "model.net.channels=[16,M,8,M,8,M,8,M,8,M,8]"])
    saved["config"]["model"] = OmegaConf.to_container(other.model, resolve=True)
    saved["model"] = build_model(other).state_dict()
    save_checkpoint(saved, ck / "step1" / "best.pth")
    with pytest.raises(ConfigError, match=r"step1/best\.pth and .*step3/best\.pth are different "
                                          r"networks .* mixes two chains"):
        _report([*_without_checkpoints(chain), f"paths.checkpoints={ck}"], tmp_path / "run")


def test_another_input_size_than_the_chain_is_one_config_error(chain, tmp_path):
    with pytest.raises(ConfigError, match=r"was made for model\.image_size=64 .* this run "
                                          r"composes model\.image_size=96"):
        _report([*chain["overrides"], "model.image_size=96"], tmp_path / "run")
