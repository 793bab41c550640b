"""README "Extending": what each kind of extension touches, held to its word.

A new LR scheduler is one class + one YAML, a new metric sink is one class + one YAML, and a new
calibration method is one class + one YAML: each is declared here in a module and a folder
of the test's own (added with ``hydra.searchpath``, as a user adds theirs) and run by the real
``python run.py`` with no file of the repository changed. (A new stage
is one YAML: tests/test_stage_extra.py; a new dataset format one YAML + one reader:
tests/test_data_new_format.py.)
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY, run_cmd_env

SCHEDULER_CLASS = '''"""A schedule mdk does not have: the LR halves every ``every`` epochs (after warmup)."""
from mdk.sched.base import WarmupScheduler


class HalvingLR(WarmupScheduler):
    def __init__(self, optimizer, iters_per_epoch, warmup=None, interval="epoch", every=1):
        self.every = int(every)
        super().__init__(optimizer, iters_per_epoch, warmup, interval)

    def _main_lr(self, base_lr, t):
        return base_lr * 0.5 ** (t // self.every)

    def _main_params(self):
        return {"every": self.every}
'''
SCHEDULER_YAML = """_target_: extra_sched.HalvingLR
_partial_: true
interval: epoch
every: 1
warmup:
  iters: 0
  start_factor: 1.0
  method: linear
"""
SINK_CLASS = '''"""A sink mdk does not have: every scalar as a JSON line in the run dir."""
import json

from mdk.sinks.base import NullSink


class JsonLinesSink(NullSink):
    def __init__(self, *, run_dir, stage, group, resume_step, config, file="scalars.jsonl"):
        self.path = run_dir / f"{stage}_{file}"

    def log(self, scalars, step):
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **scalars}) + "\\n")
'''
SINK_YAML = """log_every: 2
sinks:
  jsonl:
    _target_: extra_sink.JsonLinesSink
    file: scalars.jsonl
"""

CALIBRATION_CLASS = '''"""A calibration method mdk does not have: a power of two >= the max, and
>= its own setting ``floor``."""
import torch

from mdk.checks import number
from mdk.quant.calibrate import CapObserver


class Pow2Cap(CapObserver):
    def __init__(self, floor=2.0 ** -20, *, rank=0, world=1):
        self.floor = number("step.calibration.floor", floor, 0.0, low_open=True)
        super().__init__(None, rank=rank, world=world)  # reads the max of every value

    def batch(self, y):
        top = y.max()
        return torch.exp2(torch.ceil(torch.log2(top.clamp_min(self.floor)))), top
'''
CALIBRATION_YAML = """_target_: extra_cal.Pow2Cap
floor: 0.25
"""


def _repo_state() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                          text=True).stdout


@pytest.mark.slow
def test_a_new_scheduler_and_a_new_sink_are_a_class_and_a_yaml_each(tmp_path):
    extra = tmp_path / "conf"
    (extra / "scheduler").mkdir(parents=True)
    (extra / "logger").mkdir()
    (extra / "scheduler" / "halving.yaml").write_text(SCHEDULER_YAML)
    (extra / "logger" / "jsonl.yaml").write_text(SINK_YAML)
    (tmp_path / "extra_sched.py").write_text(SCHEDULER_CLASS)
    (tmp_path / "extra_sink.py").write_text(SINK_CLASS)
    before = _repo_state()
    run, ck = tmp_path / "run", tmp_path / "ck"
    argv = [sys.executable, str(REPO / "run.py"), *TINY,
            f"paths.data={tmp_path / 'data'}", f"paths.checkpoints={ck}", f"hydra.run.dir={run}",
            f"hydra.searchpath=[file://{extra}]", "scheduler=halving", "logger=jsonl"]
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}:{tmp_path}")
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _repo_state() == before  # nothing of the repository was touched
    # The files of the two extensions: one class and one YAML each.
    assert sorted(q.relative_to(extra).as_posix() for q in extra.rglob("*.yaml")) == [
        "logger/jsonl.yaml", "scheduler/halving.yaml"]
    # The scheduler ran: 48 images / batch 8 = 6 iterations per epoch, 2 epochs; after the last
    # step the epoch clock reads 2, so the LR is the base LR halved twice.
    last = torch.load(ck / "step1" / "last.pth", weights_only=False)
    assert last["trainer"]["iter"] == 12
    assert last["scheduler"]["schedule"]["class"] == "HalvingLR"
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(2e-3 * 0.25)
    # The sink ran: the loss every 2 iterations (log_every) and at each epoch end, then val mAP.
    lines = [json.loads(x) for x in (run / "step1_scalars.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in lines if "loss/total" in x]
    assert steps == [2, 4, 6, 8, 10, 12]
    # the LR each logged step trained with: epoch 0 the base LR, epoch 1 half of it
    assert [x["lr"] for x in lines if "lr" in x] == pytest.approx([2e-3] * 3 + [1e-3] * 3)
    assert any("val/map50" in x for x in lines)


@pytest.mark.slow
def test_a_new_calibration_method_is_a_class_and_a_yaml(tmp_path):
    extra = tmp_path / "conf"
    (extra / "step" / "calibration").mkdir(parents=True)
    (extra / "step" / "calibration" / "pow2.yaml").write_text(CALIBRATION_YAML)
    (tmp_path / "extra_cal.py").write_text(CALIBRATION_CLASS)
    before = _repo_state()
    run, ck = tmp_path / "run", tmp_path / "ck"
    common = [sys.executable, str(REPO / "run.py"), *TINY, "trainer.epochs=1",
              "trainer.limit_train_batches=2", f"paths.data={tmp_path / 'data'}",
              f"paths.checkpoints={ck}", f"hydra.run.dir={run}",
              f"hydra.searchpath=[file://{extra}]"]
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}:{tmp_path}")
    # in a pipeline: the cal stage's method by the name of its YAML
    p = subprocess.run([*common, "pipeline=[step1,step2,cal]", "+stages.cal.calibration=pow2"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _repo_state() == before
    assert [q.relative_to(extra).as_posix() for q in extra.rglob("*.yaml")] == [
        "step/calibration/pow2.yaml"]
    # The method ran with its own setting (on 2 batches: trainer.limit_train_batches reaches the
    # cal pass): named in the caps file, every cap a power of two, none below its floor.
    doc = json.loads((ck / "cal" / "caps.json").read_text())
    caps = [layer["cap"] for layer in doc["layers"]]
    assert doc["meta"]["method"] == "extra_cal.Pow2Cap" and doc["meta"]["batches"] == 2
    assert doc["meta"]["floor"] == 0.25
    assert all(c >= 0.25 and math.log2(c).is_integer() for c in caps)
    best = torch.load(ck / "cal" / "best.pth", weights_only=False)
    assert [float(best["model"][f"layers.{i}.cap"]) for i in range(len(caps))] == caps
    assert {k: v for k, v in best["hparams"].items() if k.startswith("step.calibration")} == {
        "step.calibration._target_": "extra_cal.Pow2Cap", "step.calibration.floor": 0.25}
    # step=cal alone picks it as a group option; its class checks its setting before anything runs
    bad = subprocess.run([*common, "step=cal", "step/calibration=pow2", "step.calibration.floor=0"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1] == (
        "config error: step.calibration.floor=0 (cal) must be a number > 0")
