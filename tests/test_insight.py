"""The report's measures without a trained chain (mdk/insight/): how the work is shared, the
ranking, weight SQNR against mask width, "only these layers quantized" (and that it leaves the
model as it was), and the command's one-line error when there is nothing to report on."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY, run_cmd_env
from mdk.engine.build import build_data
from mdk.engine.runner import run_stage
from mdk.errors import ConfigError
from mdk.insight.layer_modes import mask_bits_of, measure_quantized, quantized_only
from mdk.insight.report_json import ranking, sensitivities
from mdk.insight.report_stage import share
from mdk.insight.scoring import EvalSet, Score, score
from mdk.insight.sqnr import db, layer_table, weight_sqnr
from mdk.models.build import build_model
from mdk.quant.bn_fold import chip_layers
from mdk.quant.layers import ChipConv
from mdk.stage import config_for_stage
from mdk.tools import quant_report


def test_share_is_deterministic_and_balanced():
    costs = [20.0, 1, 1, 1, 1, 3, 1, 1]
    assert share(costs, 1) == [list(range(8))]
    two = share(costs, 2)
    assert two == share(costs, 2) and sorted(two[0] + two[1]) == list(range(8))
    assert two[0] == [0]  # the costliest item alone on one rank, everything else on the other
    assert share([1.0, 1.0, 1.0], 2) == [[0, 2], [1]]


def test_ranking_and_signs():
    f, q = Score(0.8, 1.0), Score(0.6, 1.5)
    s = sensitivities(f, q, only=Score(0.7, 1.2), left=Score(0.65, 1.4))
    assert s == pytest.approx({"sensitivity_map": 0.1, "sensitivity_loss": 0.2,
                               "left_float_map": 0.05, "left_float_loss": 0.1})
    layers = [{"index": 0, "sensitivity_map": 0.1, "sensitivity_loss": 0.0},
              {"index": 1, "sensitivity_map": 0.1, "sensitivity_loss": 0.3},
              {"index": 2, "sensitivity_map": 0.2, "sensitivity_loss": -1.0},
              {"index": 3, "sensitivity_map": 0.1, "sensitivity_loss": 0.0}]
    assert ranking(layers) == [2, 1, 0, 3]
    assert db(100.0, 1.0) == pytest.approx(20.0) and db(1.0, 0.0) is None


def test_weight_sqnr_grows_with_the_mask_width():
    torch.manual_seed(0)
    layer = ChipConv(16, 16)
    got = {b: weight_sqnr(layer, b, "5801") for b in (1, 3, 8)}
    assert all(v[0] is not None and 0 < v[0] < 80 for v in got.values())
    assert got[8][0] > got[3][0] > got[1][0]
    assert got[8][0] > 30  # 8-bit mantissas: ~6 dB per bit
    # an exactly representable layer has no noise (infinite SQNR)
    with torch.no_grad():
        layer.conv.weight.copy_(torch.randint(-100, 100, layer.conv.weight.shape) / 2.0 ** 8)
        layer.conv.bias.zero_()
    assert weight_sqnr(layer, 8, "5801") == (None, 8)


@pytest.fixture
def subject(tiny_cfg):
    """A TINY model with folded BN, random weights and caps: a subject's structure."""
    cfg = tiny_cfg()
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    for layer in chip_layers(model):
        layer.bn = None
        layer.cap.fill_(2.0)
    _, val = build_data(cfg, model.grid)
    return model, EvalSet.from_config(cfg, val, torch.device("cpu"), images=8), cfg


def test_only_these_layers_and_the_float_reference(subject):
    model, data, cfg = subject
    bits = mask_bits_of(model)
    assert bits == dict(enumerate([3, 3, 3, 3, 3, 3, 8]))
    float_ref = score(model, data)
    assert data.images == 8
    # nothing quantized is the float reference: sensitivity 0 exactly
    assert measure_quantized(model, {}, data, "5801") == float_ref
    with quantized_only(model, {1: 8, 6: 8}, "5801") as m:
        flags = [(c.quant_weight, c.quant_act, c.mask_bits) for c in chip_layers(m)]
    assert flags[1] == (True, True, 8) and flags[6] == (True, True, 8)
    assert flags[0] == (False, False, 3)
    # and the model is left as it was
    assert [(c.quant_weight, c.quant_act, c.mask_bits) for c in chip_layers(model)] == \
        [(False, False, b) for b in bits.values()]
    assert measure_quantized(model, {0: 3}, data, "5801").loss != float_ref.loss
    with pytest.raises(ValueError, match=r"layers \[9\] do not exist"):
        measure_quantized(model, {9: 3}, data, "5801")
    with pytest.raises(ValueError, match="does not support 4-bit"):
        measure_quantized(model, {0: 4}, data, "5801")


def test_activation_sqnr_isolated_and_cumulative(subject):
    model, data, _ = subject
    images = torch.stack([data.dataset[i][0] for i in range(4)])
    rows = layer_table(model, [images], "5801")
    assert len(rows) == 7
    # layer 0 sees the same input either way; later layers add up the errors before them
    assert rows[0]["act_sqnr_db_isolated"] == rows[0]["act_sqnr_db_cumulative"]
    assert rows[3]["act_sqnr_db_cumulative"] < rows[3]["act_sqnr_db_isolated"]
    # the float model's values above the cap: a cap far below them clips every positive one,
    # one above them all clips none
    chip_layers(model)[2].cap.fill_(1e-3)
    rows2 = layer_table(model, [images], "5801")
    assert rows2[2]["clipped_fraction"] > rows[2]["clipped_fraction"] + 0.05
    assert rows2[2]["act_sqnr_db_isolated"] < rows[2]["act_sqnr_db_isolated"]
    chip_layers(model)[2].cap.fill_(1e6)
    assert layer_table(model, [images], "5801")[2]["clipped_fraction"] == 0.0


def test_the_tool_refuses_step_and_pipeline():
    with pytest.raises(ValueError, match="leave step and pipeline out"):
        quant_report.command(["pipeline=[a]"])
    assert quant_report.command(["seed=1"])[-2:] == ["step=quant_report", "seed=1"]


def test_no_checkpoints_is_one_line_naming_the_folder(tmp_path):
    ck = tmp_path / "none"
    p = subprocess.run([sys.executable, "-m", "mdk.tools.quant_report", *TINY,
                        f"paths.data={tmp_path}/data", f"paths.checkpoints={ck}",
                        f"hydra.run.dir={tmp_path}/run"], cwd=REPO,
                       env=dict(run_cmd_env(), OMP_NUM_THREADS="1"), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith(f"missing stage input: paths.checkpoints={ck} holds no stage checkpoint")
    assert "python run.py pipeline=[step1,step2,cal,step3,step4]" in line


def test_a_bad_sensitivity_subset_is_one_config_error(tiny_cfg, tmp_path):
    cfg = tiny_cfg("step=quant_report", "step.report.sensitivity_images=0")
    with pytest.raises(ConfigError, match=r"step\.report\.sensitivity_images=0 must be >= 1"):
        run_stage(config_for_stage(cfg, "quant_report"), tmp_path / "run")
