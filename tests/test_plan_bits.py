"""python -m mdk.tools.plan_bits: widths per major layer measured on step1's float weights, an
exact plan within the budget, and the override that trains it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import TINY
from mdk.engine.build import build_data
from mdk.engine.runner import run_stage
from mdk.insight.bit_sensitivity import (coefficients, fisher_cost, fisher_diagonal, pool_groups,
                                         memory_of, width_costs)
from mdk.insight.layer_modes import quantized_only
from mdk.insight.scoring import EvalSet
from mdk.quant.weights import quantize_conv
from mdk.quant.bit_plan import plan_bits
from mdk.quant.bn_fold import chip_layers
from mdk.quant.modes import QuantMode, apply_mode
from mdk.stage import config_for_stage
from mdk.tools import plan_bits as tool
from mdk.tools.evaluate import load_checkpoint_model


@pytest.fixture(scope="module")
def step1_done(tmp_path_factory) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("plan")
    overrides = [*TINY, f"paths.data={tmp}/data", f"paths.checkpoints={tmp}/ck",
                 "trainer.epochs=1", "trainer.limit_train_batches=3"]
    from conftest import compose

    run_stage(config_for_stage(compose(overrides), "step1"), tmp / "run")
    return tmp, overrides


def test_major_layers_end_at_each_pool_and_the_tail_is_one(step1_done):
    _, overrides = step1_done
    model = load_checkpoint_model(step1_done[0] / "ck" / "step1" / "best.pth", overrides).model
    # TINY: channels [8,M,8,M,8,M,8,M,8,M,8] + the output conv: 5 pools, then 2 layers
    assert pool_groups(model) == [[0], [1], [2], [3], [4], [5, 6]]
    assert coefficients(model, [5, 6]) == 8 * 8 * 9 + chip_layers(model)[6].conv.weight.numel()
    assert memory_of(model, [3] * 7) == 3 * sum(l.conv.weight.numel() for l in chip_layers(model))


def test_the_tool_plans_within_the_budget_and_prints_the_override(step1_done, capsys):
    tmp, overrides = step1_done
    out = tmp / "plan.json"
    assert tool.main(["budget_kb=current", "images=8", f"out={out}", *overrides]) == 0
    doc = json.loads(out.read_text())
    printed = capsys.readouterr().out
    bits = doc["mask_bits"]
    assert f"model.net.mask_bits=[{','.join(map(str, bits))}]" in printed
    assert doc["memory_bits"] <= doc["budget_bits"] == 3 * 216 + 3 * 576 * 5 + 8 * 720
    assert doc["images"] == 8 and doc["widths"] == [1, 3, 8] and doc["by"] == "loss"
    for m in doc["major_layers"]:  # one width per major layer, costs measured for every width
        assert {bits[i] for i in m["layers"]} == {m["mask_bits"]}
        assert set(m["cost"]) == {"1", "3", "8"}
    # the plan is the exact optimum of the measured costs (tests/test_bit_plan.py: exactness)
    assert doc["cost"] == pytest.approx(sum(m["cost"][str(m["mask_bits"])]
                                            for m in doc["major_layers"]))


def test_a_fraction_budget_is_that_fraction_of_the_current_widths_memory(step1_done, tmp_path):
    tmp, overrides = step1_done
    current, half = tmp_path / "current.json", tmp_path / "half.json"
    assert tool.main(["budget_kb=current", "images=8", f"out={current}", *overrides]) == 0
    assert tool.main(["budget=0.5", "images=8", f"out={half}", *overrides]) == 0
    full, doc = json.loads(current.read_text()), json.loads(half.read_text())
    assert doc["budget_bits"] == int(0.5 * full["budget_bits"])
    assert doc["memory_bits"] <= doc["budget_bits"] < full["memory_bits"]


def test_without_out_the_plan_lands_in_the_run_dir(step1_done, tmp_path, monkeypatch, capsys):
    """Like the quantization report: into hydra.run.dir, not the current directory."""
    tmp, overrides = step1_done
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "plan"
    assert tool.main(["budget_kb=current", "images=8", f"hydra.run.dir={run}", *overrides]) == 0
    assert json.loads((run / "plan_bits.json").read_text())["mask_bits"]
    assert not (tmp_path / "plan_bits.json").exists()
    assert f"written: {run / 'plan_bits.json'}" in capsys.readouterr().out


def test_a_deliberately_sensitive_layer_gets_the_wider_width(step1_done):
    tmp, overrides = step1_done
    loaded = load_checkpoint_model(tmp / "ck" / "step1" / "best.pth", overrides)
    model = loaded.model
    apply_mode(model, QuantMode(fold_bn=True), "5801")
    # Layer 2's kernels become a strong centre tap with faint neighbours: a 3-bit or 1-bit mask
    # (magnitudes tied to the kernel's mean |w|) shrinks the centre ninefold or smears it.
    conv = chip_layers(model)[2].conv
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        w = torch.randn(conv.weight.shape, generator=g) * 0.01
        w[:, :, 1, 1] = torch.randn(conv.weight.shape[:2], generator=g)
        conv.weight.copy_(w)
    _, val = build_data(loaded.cfg, model.grid)
    data = EvalSet.from_config(loaded.cfg, val, loaded.device, images=16)
    costs = width_costs(model, "5801", data)
    major = costs.major(model)
    assert major[2].sensitivity[3] > max(major[k].sensitivity[3] for k in (0, 1, 3, 4))
    # room to widen exactly one 576-weight major layer from 3 to 8 bits
    budget = sum(m.weights * 3 for m in major) + 576 * 5
    plan = plan_bits(major, budget)
    assert plan.bits[2] == 8 and plan.memory_bits <= budget
    with quantized_only(model, {}, "5801"):  # the layers are put back after a measurement
        assert not any(layer.quant_weight for layer in chip_layers(model))


def _float_model(step1_done, images: int = 16):
    tmp, overrides = step1_done
    loaded = load_checkpoint_model(tmp / "ck" / "step1" / "best.pth", overrides)
    apply_mode(loaded.model, QuantMode(fold_bn=True), "5801")
    _, val = build_data(loaded.cfg, loaded.model.grid)
    return loaded.model, EvalSet.from_config(loaded.cfg, val, loaded.device, images=images)


def test_the_fisher_diagonal_is_the_mean_squared_gradient_over_the_batches(step1_done):
    model, data = _float_model(step1_done)  # 16 images in batches of 8: two batches
    model.train()
    fisher = fisher_diagonal(model, data, "5801")
    layers = chip_layers(model)
    assert model.training and not any(layer.quant_weight for layer in layers)  # put back
    expected = [torch.zeros_like(layer.conv.weight) for layer in layers]
    for start in (0, 8):
        images = torch.stack([data.dataset[i][0] for i in range(start, start + 8)])
        targets = torch.stack([data.dataset[i][1] for i in range(start, start + 8)])
        model.zero_grad()
        model.eval()
        data.loss_fn(model(images), targets)["total"].backward()
        for e, layer in zip(expected, layers):
            e += layer.conv.weight.grad.square() / 2
    for f, e in zip(fisher, expected):
        torch.testing.assert_close(f, e, rtol=1e-5, atol=1e-12)
    # the cost of one layer at a width: half the Fisher-weighted squared quantization error
    w, b = layers[3].conv.weight.detach(), layers[3].conv.bias.detach()
    wq, _ = quantize_conv(w, b, 3, 8, 20)
    assert fisher_cost(layers[3], fisher[3], 3, "5801") == pytest.approx(
        0.5 * float((expected[3] * (wq - w) ** 2).sum()), rel=1e-5)


def test_by_fisher_plans_from_predicted_costs_and_8_bits_cost_least(step1_done, tmp_path):
    tmp, overrides = step1_done
    out = tmp_path / "plan.json"
    assert tool.main(["budget=0.75", "images=8", "by=fisher", f"out={out}", *overrides]) == 0
    doc = json.loads(out.read_text())
    assert doc["by"] == "fisher" and doc["memory_bits"] <= doc["budget_bits"]
    for m in doc["major_layers"]:
        assert "score" not in m  # predicted, not measured per width
        assert 0 <= m["cost"]["8"] < m["cost"]["3"] and 0 <= m["cost"]["8"] < m["cost"]["1"]
    assert doc["cost"] == pytest.approx(sum(m["cost"][str(m["mask_bits"])]
                                            for m in doc["major_layers"]))


def test_a_cost_bound_gives_the_least_memory_within_it(step1_done, tmp_path):
    tmp, overrides = step1_done
    free, bounded = tmp_path / "free.json", tmp_path / "bounded.json"
    assert tool.main(["budget=1", "images=8", "by=map", f"out={free}", *overrides]) == 0
    costs = json.loads(free.read_text())["major_layers"]
    widest = sum(min(m["cost"].values()) for m in costs)
    assert tool.main([f"max_cost={widest + 0.05}", "images=8", "by=map", f"out={bounded}",
                      *overrides]) == 0
    doc = json.loads(bounded.read_text())
    assert doc["budget_bits"] is None and doc["max_cost"] == widest + 0.05
    assert doc["cost"] <= widest + 0.05
    # no plan of less memory stays within the bound (the planner is exact: tests/test_bit_plan.py)
    assert doc["cost"] == pytest.approx(sum(m["cost"][str(m["mask_bits"])]
                                            for m in doc["major_layers"]))


@pytest.mark.parametrize("args,line", [
    (["images=8"], "give one of budget_kb=<KiB>"),
    (["budget=0.5", "max_cost=0.1"], "give one of budget_kb=<KiB>"),
    (["max_cost=-1"], "max_cost='-1' must be a number >= 0"),
    (["max_cost=0", "by=fisher"], "max_cost=0: no plan costs at most 0"),
    (["budget_kb=10", "budget=0.5"], "give one of budget_kb=<KiB>"),
    (["budget=-1"], "budget='-1' must be a fraction > 0 of the memory today's widths take"),
    (["budget=0.001"], "budget=0.001: "),
    (["budget_kb=0.01"], "is below the narrowest plan's"),
    (["budget_kb=lots"], "budget_kb='lots' must be a number of KiB or 'current'"),
    (["budget_kb=10", "by=speed"], "by='speed': measure the cost by one of loss, map, fisher"),
])
def test_bad_arguments_are_one_line(step1_done, capsys, args, line):
    _, overrides = step1_done
    assert tool.main([*args, *overrides]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0]


def test_no_float_checkpoint_names_the_folder_and_what_to_run(tmp_path, capsys):
    assert tool.main(["budget_kb=10", *TINY, f"paths.checkpoints={tmp_path}/none"]) == 1
    err = capsys.readouterr().err.strip()
    assert f"no float checkpoint under paths.checkpoints={tmp_path}/none" in err
    assert "python run.py step=" in err
