"""A new stage is one YAML (plus one function when its work is new): issue 12's promise, tested.

Two stages the repository does not have are declared in a config folder of the test's own, added
to the search path with ``hydra.searchpath``: ``polish`` (one more float training epoch from
step1's best, at half the learning rate) and ``measure`` (new work: a function in a module of the
test's own that evaluates its input and writes a file). ``python run.py
pipeline=[step1,polish,measure]`` runs them with no change to mdk.
"""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from conftest import REPO, TINY, run_cmd_env

QUANT_OFF = """quant:
  fold_bn: false
  weights: false
  activations: false
  fuse_gains: false
eval_quant: null
"""
POLISH = """defaults:
  - /_schema_step_stage@_here_
  - _self_

name: polish
kind: train
init_from: step1
init_required: true
next: measure
export: false
""" + QUANT_OFF + """epochs: 1
lr_scale: 0.5
"""
MEASURE = POLISH.replace("name: polish", "name: measure").replace("init_from: step1",
    "init_from: polish").replace("next: measure", "next: null").replace(
    "kind: train", "kind: extra_work.measure")
WORK = '''"""The work of the test's ``measure`` stage: evaluate the input weights, write them down."""
import json


def measure(ctx):
    result = ctx.evaluate()
    if ctx.world.is_main:
        (ctx.run_dir / "measure.json").write_text(json.dumps(
            {"stage": ctx.spec.name, "from": ctx.spec.init_from, "map50": result["map50"],
             "loss": result["loss"]}))
    return {"best_map50": result["map50"]}
'''


def test_a_stage_declared_outside_mdk_runs_in_a_pipeline(tmp_path):
    extra = tmp_path / "extra"
    (extra / "step").mkdir(parents=True)
    (extra / "step" / "polish.yaml").write_text(POLISH)
    (extra / "step" / "measure.yaml").write_text(MEASURE)
    (tmp_path / "extra_work.py").write_text(WORK)
    run, ck = tmp_path / "run", tmp_path / "ck"
    argv = [sys.executable, str(REPO / "run.py"), *TINY, f"paths.data={tmp_path / 'data'}",
            f"paths.checkpoints={ck}", f"hydra.run.dir={run}",
            f"hydra.searchpath=[file://{extra}]", "pipeline=[step1,polish,measure]"]
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}:{tmp_path}")
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "=== polish ===" in p.stdout and "=== measure ===" in p.stdout
    polish = torch.load(ck / "polish" / "best.pth", weights_only=False)
    assert polish["stage"] == "polish"
    # polish trained one epoch at half step1's learning rate, starting from step1's best
    assert polish["trainer"]["iter"] == 48 // 8
    step1 = torch.load(ck / "step1" / "best.pth", weights_only=False)
    assert polish["optimizer"]["param_groups"][0]["initial_lr"] == \
        step1["optimizer"]["param_groups"][0]["initial_lr"] / 2
    # measure evaluated exactly the weights polish chose as its best
    out = json.loads((run / "measure.json").read_text())
    assert out["stage"] == "measure" and out["from"] == "polish"
    assert (out["map50"], out["loss"]) == (polish["metric"]["map50"], polish["metric"]["loss"])


def test_one_record_type_read_field_by_field():
    """A stage record is one type (mdk.stage_config.StageConf): its reader takes each field it
    declares from the node, so a new stage key is one field; a checkpoint's older record (a
    ``calibrate`` flag for its kind, keys of other nodes) reads too."""
    from dataclasses import dataclass, fields

    from conftest import compose
    from mdk.stage_config import QuantMode, StageConf

    @dataclass
    class WithANewKey(StageConf):
        warmup_from: str = "none"

    rec = WithANewKey.from_node({"name": "x", "warmup_from": "step0", "calibration": {"a": 1}})
    assert rec.warmup_from == "step0" and rec.kind == "train" and not hasattr(rec, "calibration")
    old = StageConf.from_node({"name": "cal", "calibrate": True, "init_from": "step2",
                               "quant": {"fold_bn": True, "weights": True}})
    assert old.kind == "calibrate" and old.quant == QuantMode(fold_bn=True, weights=True)
    assert old.eval_mode == old.quant and not old.trains
    for name in ("step1", "step2", "cal", "step3", "step4"):
        node = compose([f"step={name}"]).step
        rec = StageConf.from_node(node)
        plain = {f.name: getattr(rec, f.name) for f in fields(rec)}
        assert plain["quant"] == QuantMode.from_mapping(node.quant)
        assert all(plain[k] == node[k] for k in plain if k not in ("quant", "eval_quant", "bar"))
