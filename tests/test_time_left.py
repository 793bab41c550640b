"""The time to the end of a stage, said after the first epoch (and refined after the first
evaluation): epochs left x the measured epoch + evaluations left x the measured evaluation. On a
fake clock: a training step takes 2 s, an evaluation 20 s."""
from __future__ import annotations

import types

import torch

from mdk.engine import hooks, time_left
from mdk.engine.hooks import EvalHook
from mdk.engine.time_left import TimeLeftHook
from mdk.engine.loop import HookBase, Trainer


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _train(epochs: int, every: int, caplog, monkeypatch) -> list[str]:
    clock = _Clock()
    fake = types.SimpleNamespace(perf_counter=clock, monotonic=clock)
    for module in (hooks, time_left):
        monkeypatch.setattr(module, "time", fake)

    class Step(HookBase):
        def after_step(self) -> None:
            clock.now += 2.0

    def evaluate():
        clock.now += 20.0
        return {"map50": 0.5, "loss": 1.0}

    net = torch.nn.Linear(2, 1)
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(5)]
    t = Trainer(net, lambda p, y: {"total": (p - y).square().mean()},
                torch.optim.SGD(net.parameters(), lr=0.1), data, torch.device("cpu"), epochs=epochs,
                iters_per_epoch=5)
    t.register_hooks([Step(), EvalHook(evaluate, every), TimeLeftHook("step1", every, True)])
    with caplog.at_level("INFO", logger="mdk.engine"):
        t.train()
    return [r.getMessage() for r in caplog.records if "to the end of the stage" in r.getMessage()]


def test_the_first_epoch_says_the_time_left(caplog, monkeypatch):
    lines = _train(40, 1, caplog, monkeypatch)
    # 39 x (10 s training + 20 s evaluation)
    assert lines == ["step1: epoch 1 took 30 s (its evaluation 20 s); 39 epochs and 39 "
                     "evaluations left: about 19 min 30 s to the end of the stage"]


def test_evaluations_not_yet_timed_are_said_then_counted(caplog, monkeypatch):
    lines = _train(6, 3, caplog, monkeypatch)
    assert lines == [
        "step1: epoch 1 took 10 s; 5 epochs and 2 evaluations left: about 50 s to the end of "
        "the stage; 2 evaluations not timed yet",
        "step1: epoch 3 took 30 s (its evaluation 20 s); 3 epochs and 1 evaluation left: about "
        "50 s to the end of the stage"]


def test_the_first_epochs_start_up_is_not_counted_for_every_epoch(caplog, monkeypatch):
    """A first step that takes 12 s (loader workers starting) instead of 2 s is paid once."""
    clock = _Clock()
    fake = types.SimpleNamespace(perf_counter=clock, monotonic=clock)
    for module in (hooks, time_left):
        monkeypatch.setattr(module, "time", fake)

    class Step(HookBase):
        def after_step(self) -> None:
            clock.now += 12.0 if self.trainer.iter == 1 else 2.0

    net = torch.nn.Linear(2, 1)
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(5)]
    t = Trainer(net, lambda p, y: {"total": (p - y).square().mean()},
                torch.optim.SGD(net.parameters(), lr=0.1), data, torch.device("cpu"), epochs=11,
                iters_per_epoch=5)
    t.register_hooks([Step(), EvalHook(lambda: {"map50": 0.5}, 100), TimeLeftHook("step1", 100, True)])
    with caplog.at_level("INFO", logger="mdk.engine"):
        t.train()
    lines = [r.getMessage() for r in caplog.records if "to the end of the stage" in r.getMessage()]
    # epoch 1 took 20 s, but a steady epoch is 5 x 2 s: 10 epochs left are 100 s (+ the last
    # evaluation, not timed yet)
    assert lines[0].startswith("step1: epoch 1 took 20 s; 10 epochs and 1 evaluation left: "
                               "about 1 min 40 s to the end of the stage")
