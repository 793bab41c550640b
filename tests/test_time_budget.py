"""``trainer.time``: a training stage sized by a time budget. The epochs that fit a cost model,
the hook that ends a stage at the budget (on a fake clock), a probe that leaves the run's model
and random streams alone, and the real command: the epochs it chose and logged, a budget
shorter than one epoch, a resumed run, a pipeline, and values that are not durations."""
from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from conftest import REPO, compose, run_cmd_env
from mdk.engine import time_budget
from mdk.engine.hooks import EvalHook
from mdk.engine.loop import HookBase, Trainer
from mdk.engine.time_budget import Costs, TimeBudgetHook, fit_epochs
from mdk.errors import ConfigError
from mdk.trainer_config import check_trainer, seconds

TINY = ["debug=tiny", "dataset.generate.num_train=64", "dataset.generate.num_val=16"]
CHOSE = re.compile(r"trainer.time=[^:]+: step1 trains (\d+) epochs")
AGAIN = re.compile(r"the same schedule again: trainer.epochs=(\d+)")


def _chosen(text: str) -> int:
    """The epochs the run ended with: the probe's choice, or the plan after the first epoch when
    that epoch's steps cost otherwise than the probe's (a loaded machine)."""
    assert CHOSE.search(text), text[-2000:]
    return int(AGAIN.findall(text)[-1])


@pytest.mark.parametrize("value, want", [("5m", 300), ("300s", 300), ("1h30m", 5400),
                                         ("2.5m", 150), (90, 90), ("90", 90), ("1.5h", 5400)])
def test_durations_read_as_seconds(value, want):
    assert seconds(value) == want


@pytest.mark.parametrize("value", ["abc", "0", 0, "-5m", "m", "5 minutes", True, "0s"])
def test_a_value_that_is_not_a_duration_is_one_line_naming_the_key_and_the_forms(value):
    with pytest.raises(ConfigError, match=r"^trainer.time=.* must be a duration such as 5m, "
                                          r"300s, 1h30m or 2.5m \(or a number of seconds\), above zero$"):
        seconds(value)
    with pytest.raises(ConfigError, match=r"^trainer.time="):
        check_trainer(compose([*TINY, f"trainer.time={value}"]))


def test_the_most_epochs_that_fit_the_cost_model():
    costs = Costs({160: 0.2, 224: 0.4}, eval_s=5.0)
    # 10 steps an epoch: an epoch at 224 is 10 x 0.4 x 1.08 + 0.5 = 4.82 s; evaluated each epoch
    e, est = fit_epochs(100.0, costs, 10, None, 224, eval_every=1)
    assert e == 10 and est == pytest.approx(10 * (4.82 + 5.0))
    assert fit_epochs(98.0, costs, 10, None, 224, eval_every=1)[0] == 9
    # three quarters of the epochs at 160 px cost about half: more epochs fit
    mixed, _ = fit_epochs(100.0, costs, 10, [(160, 0.75), (224, 0.25)], 224, eval_every=5)
    assert mixed == 23
    assert fit_epochs(1.0, costs, 10, None, 224, 1)[0] == 1  # at least one: the budget cuts it


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_ends_the_stage_mid_epoch_evaluates_and_says_so(monkeypatch, caplog):
    clock = _Clock()
    monkeypatch.setattr(time_budget, "time", types.SimpleNamespace(perf_counter=clock))

    class Step(HookBase):
        def after_step(self) -> None:
            clock.now += 2.0

    evals = []

    def evaluate():
        evals.append(self_trainer.batch_in_epoch)
        return {"map50": 0.5, "loss": 1.0}

    net = torch.nn.Linear(2, 1)
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(10)]
    self_trainer = Trainer(net, lambda p, y: {"total": (p - y).square().mean()},
                           torch.optim.SGD(net.parameters(), lr=0.1), data, torch.device("cpu"),
                           epochs=5, iters_per_epoch=10)
    # 50 s budget, started at t=100; an evaluation is estimated at 3 s, a save at 0.5 s
    budget = TimeBudgetHook(50.0, 5, started=100.0, spent_before=0.0, eval_estimate_s=3.0,
                            distributed=False)
    self_trainer.register_hooks([Step(), EvalHook(evaluate, 5), budget])
    with caplog.at_level("WARNING"):
        self_trainer.train()
    # epoch 1: 10 steps = 20 s; epoch 2 ends at 40 s; in epoch 3 the 4th step leaves 2 s < 3.5 s
    assert self_trainer.iter == 24 and self_trainer.epoch == 3 and self_trainer.stop
    assert evals == [4] and budget.done and budget.state_dict()["spent_s"] == pytest.approx(48.0)
    assert any("the budget ends the stage in epoch 3/5 after iteration 4" in r.getMessage()
               for r in caplog.records)


def _run(tmp: Path, name: str, *extra: str, fault: str = "") -> subprocess.CompletedProcess:
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1")
    env.pop("MDK_FAULT", None)
    if fault:
        env["MDK_FAULT"] = fault
    args = [*TINY, f"paths.data={tmp / 'data'}", f"paths.checkpoints={tmp / name}",
            f"hydra.run.dir={tmp / 'runs' / name}", *extra]
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _log(tmp: Path, name: str) -> str:
    return (tmp / "runs" / name / "run.log").read_text()


@pytest.mark.slow
def test_the_command_logs_the_epochs_it_chose_and_they_repeat_the_run(tmp_path):
    r = _run(tmp_path, "budget", "trainer.time=25s")
    assert r.returncode == 0, r.stderr[-2000:]
    text = _log(tmp_path, "budget")
    n = _chosen(text)
    assert n >= 2
    assert re.search(r"step1: epoch 1 took .*trainer.time=25 s: .* (to spare|short)", text)
    if "the budget ends the stage" not in text:  # it fit: trainer.epochs=N is the same run
        again = _run(tmp_path, "epochs", f"trainer.epochs={n}")
        assert again.returncode == 0, again.stderr[-2000:]
        a = torch.load(tmp_path / "budget" / "step1" / "last.pth", weights_only=False)
        b = torch.load(tmp_path / "epochs" / "step1" / "last.pth", weights_only=False)
        assert a["trainer"]["iter"] == b["trainer"]["iter"]
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.slow
def test_a_budget_shorter_than_one_epoch_ends_in_it_with_an_evaluated_best(tmp_path):
    # 1,280 images in batches of 8: 160 steps an epoch (over 1 s even on a fast idle CPU at
    # 64 px); 1 s leaves no time past start-up
    r = _run(tmp_path, "short", "trainer.time=1s", "dataset.generate.num_train=1280")
    assert r.returncode == 0, r.stderr[-2000:]
    text = _log(tmp_path, "short")
    assert "step1 trains 1 epochs" in text
    assert re.search(r"the budget ends the stage in epoch 1/1 after iteration \d+", text)
    last = torch.load(tmp_path / "short" / "step1" / "last.pth", weights_only=False)
    assert 1 <= last["trainer"]["iter"] < 160 and last["hooks"]["TimeBudgetHook"]["done"]
    assert (tmp_path / "short" / "step1" / "best.pth").is_file()
    assert re.search(r"epoch 1/1\s+val mAP@0.5", text)
    # the same command again: the budget is spent, nothing is trained
    again = _run(tmp_path, "short", "trainer.time=1s", "dataset.generate.num_train=1280")
    assert again.returncode == 0, again.stderr[-2000:]
    after = torch.load(tmp_path / "short" / "step1" / "last.pth", weights_only=False)
    assert after["trainer"]["iter"] == last["trainer"]["iter"]


@pytest.mark.slow
def test_a_resumed_run_keeps_its_epochs_and_the_time_it_spent(tmp_path):
    first = _run(tmp_path, "resume", "trainer.time=40s", "trainer.checkpoint_every_iters=2",
                 fault="kill:iter:11")
    assert first.returncode != 0
    chosen = _chosen(_log(tmp_path, "resume"))
    saved = torch.load(tmp_path / "resume" / "step1" / "last.pth", weights_only=False)
    state = saved["hooks"]["TimeBudgetHook"]
    assert state["epochs"] == chosen and 0 < state["spent_s"] < 40 and not state["done"]
    second = _run(tmp_path, "resume", "trainer.time=40s")
    assert second.returncode == 0, second.stderr[-2000:]
    text = _log(tmp_path, "resume")
    assert f"step1 resumes its {chosen} epochs with" in text
    end = torch.load(tmp_path / "resume" / "step1" / "last.pth", weights_only=False)
    assert end["hooks"]["TimeBudgetHook"]["spent_s"] > state["spent_s"]
    assert end["hooks"]["TimeBudgetHook"]["epochs"] == chosen


@pytest.mark.slow
def test_every_training_stage_of_a_pipeline_gets_the_budget(tmp_path):
    r = _run(tmp_path, "chain", "trainer.time=10s", "pipeline=[step1,step2,cal,step3]")
    assert r.returncode == 0, r.stderr[-2000:]
    text = _log(tmp_path, "chain")
    for stage in ("step1", "step2", "step3"):
        assert re.search(rf"trainer.time=10 s: {stage} trains \d+ epochs", text), stage
    assert "trainer.time=10 s: cal" not in text  # one pass: no budget
