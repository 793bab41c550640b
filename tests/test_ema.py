"""ModelEMA: closed-form updates, bit-identical resume, the swap restoring raw bits, its settings.
The hook in the engine, DDP and the checkpoint: tests/test_ema_hook.py."""
from __future__ import annotations

import io
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import compose
from helpers.tiny_net import tiny_net
from mdk.engine.ema import ModelEMA, ema_from_config
from mdk.errors import ConfigError
from mdk.trainer_config import check_trainer


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32) \
        if t.is_floating_point() else t


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(bits(a[k]), bits(b[k])) for k in a)


def trajectory(steps: int) -> list[dict[str, torch.Tensor]]:
    """Model states after each of ``steps`` SGD steps in train mode (BN statistics move too)."""
    net = tiny_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    states = []
    for _ in range(steps):
        x = torch.randn(4, 3, 6, 6, generator=g)
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
        states.append({k: v.clone() for k, v in net.state_dict().items()})
    return states


@pytest.mark.parametrize("tau", [0.0, 3.0])
def test_updates_follow_the_closed_form(tau):
    net = tiny_net()
    w0 = {k: v.double().clone() for k, v in net.state_dict().items()}
    ema = ModelEMA(net, decay=0.9, tau=tau, dtype=torch.float64)
    states = trajectory(3)
    expected = dict(w0)
    for n, st in enumerate(states, start=1):
        d = 0.9 * (1 - math.exp(-n / tau)) if tau else 0.9
        assert ema.decay_at(n) == pytest.approx(d, abs=1e-15)
        net.load_state_dict(st)
        ema.update(net)
        expected = {k: d * expected[k] + (1 - d) * st[k].double() for k in st}
    assert ema.updates == 3
    for k, v in ema.shadow.items():
        if k.endswith("num_batches_tracked"):   # integers are copied, not averaged
            assert v.dtype == torch.int64 and v.item() == states[-1][k].item() == 3
        else:
            assert v.dtype == torch.float64
            torch.testing.assert_close(v, expected[k], rtol=1e-14, atol=1e-15)
    # With warm-up the first update nearly replaces the weights: d_1 = 0.9 * (1 - e^(-1/3)).
    if tau:
        assert ema.decay_at(1) == pytest.approx(0.25512, abs=1e-5)


def test_unchanged_entries_stay_bit_identical():
    net = tiny_net()
    net[5].weight.requires_grad_(False)
    frozen = net[5].weight.detach().clone()
    ema = ModelEMA(net, decay=0.999, tau=0.0)
    for st in trajectory(5):
        st = dict(st)
        st["5.weight"] = frozen               # this one never moves
        net.load_state_dict(st)
        ema.update(net)
    assert torch.equal(bits(ema.shadow["5.weight"]), bits(frozen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_resume_continues_bit_identically(dtype):
    states, n, k = trajectory(10), 10, 4
    net = tiny_net()
    straight = ModelEMA(net, decay=0.99, tau=2.0, dtype=dtype)
    for st in states[:n]:
        net.load_state_dict(st)
        straight.update(net)

    net = tiny_net()
    first = ModelEMA(net, decay=0.99, tau=2.0, dtype=dtype)
    for st in states[:k]:
        net.load_state_dict(st)
        first.update(net)
    buf = io.BytesIO()
    torch.save({"ema": first.state_dict()}, buf)   # through a checkpoint file's round trip
    buf.seek(0)
    saved = torch.load(buf)["ema"]

    fresh_net = tiny_net(seed=5)                    # a new process: other initial weights
    resumed = ModelEMA(fresh_net, decay=0.99, tau=2.0, dtype=dtype)
    resumed.load_state_dict(saved)
    for st in states[k:n]:
        fresh_net.load_state_dict(st)
        resumed.update(fresh_net)
    assert resumed.updates == straight.updates == n
    assert same_bits(resumed.shadow, straight.shadow)


def test_swap_evaluates_ema_weights_and_restores_raw_bits():
    net = tiny_net()
    ema = ModelEMA(net, decay=0.5, tau=0.0, dtype=torch.float64)
    for st in trajectory(4):
        net.load_state_dict(st)
        ema.update(net)
    raw = {k: v.clone() for k, v in net.state_dict().items()}
    params = [id(p) for p in net.parameters()]
    x = torch.randn(2, 3, 6, 6)
    net.eval()
    with ema.swapped(net) as m:
        assert m is net
        for k, v in net.state_dict().items():
            assert v.dtype == raw[k].dtype
            assert torch.equal(v, ema.shadow[k].to(v.dtype))
        out_ema = net(x)
    assert same_bits(net.state_dict(), raw)
    assert [id(p) for p in net.parameters()] == params   # the optimizer's objects
    ref = tiny_net()
    ref.load_state_dict(ema.model_state_dict())
    ref.eval()
    assert torch.equal(ref(x), out_ema)
    with pytest.raises(ZeroDivisionError):               # restored on error too
        with ema.swapped(net):
            1 / 0
    assert same_bits(net.state_dict(), raw)


def test_structure_change_and_bad_settings_are_named():
    net = tiny_net()
    ema = ModelEMA(net)
    with pytest.raises(RuntimeError, match="built after the stage changes"):
        ema.update(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match=r"trainer\.ema\.decay=1\.0"):
        ModelEMA(net, decay=1.0)
    with pytest.raises(RuntimeError, match="does not match this model"):
        ModelEMA(nn.Linear(2, 2)).load_state_dict(ema.state_dict())


@pytest.mark.parametrize("key,value,line", [
    ("decay", "1.0", "trainer.ema.decay=1.0 must be in (0, 1), e.g. 0.9999"),
    ("decay", "0.0", "trainer.ema.decay=0.0 must be in (0, 1), e.g. 0.9999"),
    ("tau", "-1", "trainer.ema.tau=-1.0 must be >= 0 (0: constant decay)"),
    ("dtype", "half", "trainer.ema.dtype='half' must be one of float32, float64"),
])
def test_the_config_and_the_class_give_the_same_line(key, value, line):
    """One check of trainer.ema's values (mdk/trainer_config.py), whoever meets a bad one first."""
    cfg = compose(["trainer.ema.enabled=true"])
    OmegaConf.update(cfg, f"trainer.ema.{key}", float(value) if key != "dtype" else value)
    with pytest.raises(ConfigError) as from_config:
        check_trainer(cfg)
    with pytest.raises(ConfigError) as from_class:
        ema_from_config(cfg.trainer.ema, tiny_net())
    assert str(from_config.value) == str(from_class.value) == line


def test_built_from_the_trainer_ema_node():
    net = tiny_net()
    assert ema_from_config(None, net) is None
    assert ema_from_config(OmegaConf.create({"enabled": False, "decay": 0.9}), net) is None
    ema = ema_from_config(OmegaConf.create({"enabled": True, "decay": 0.99, "tau": 10,
                                            "dtype": "float64"}), net)
    assert (ema.decay, ema.tau, ema.dtype) == (0.99, 10.0, torch.float64)
    with pytest.raises(ValueError, match=r"trainer\.ema\.dtype='half'"):
        ema_from_config(OmegaConf.create({"enabled": True, "dtype": "half"}), net)
