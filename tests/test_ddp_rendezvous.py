"""Rendezvous, port and environment failure paths, in one process (fast, no workers)."""
from __future__ import annotations

import logging
import socket
import time
from collections import namedtuple

import pytest
import torch
from omegaconf import OmegaConf

from launchers.processes import spawn
from launchers.processes.join import RendezvousError, join
from mdk.data.samplers import GlobalBatchSampler
from mdk.compose import compose
from mdk.dist_config import check_dist, parse_dist_url
from mdk.errors import ConfigError


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alone(tmp_path, rank: int, url: str) -> RendezvousError:
    """One machine of two (one rank each) started alone: the agent's rendezvous gives up."""
    from helpers.ddp import ordered_sum_rank, tiny_cfg

    cfg = tiny_cfg(tmp_path, "dist.nodes=2", f"dist.rank={rank}", f"dist.dist_url={url}",
                   "dist.gpus=1", "dist.timeout_s=2")
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as e:
        spawn.run_ranks(cfg, tmp_path / "run", ordered_sum_rank)
    took = time.monotonic() - t0
    assert took < 15, f"took {took:.1f}s for a 2 s timeout"
    return e.value


def test_unreachable_dist_url_times_out_naming_address_and_what_to_check(tmp_path):
    port = _closed_port()
    msg = str(_alone(tmp_path, 1, f"127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in msg and "nothing answered" in msg
    assert "firewall" in msg and "VPN" in msg and "dist.timeout_s=2" in msg


def test_machine_0_left_alone_times_out_with_the_count_of_who_came(tmp_path):
    port = _closed_port()
    msg = str(_alone(tmp_path, 0, f"127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in msg and "1/2 clients joined" in msg and "firewall" in msg


def test_busy_port_on_several_machines_is_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        msg = str(_alone(tmp_path, 0, f"127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in msg and "in use" in msg and "every machine" in msg


def test_one_machine_never_binds_dist_url_so_a_busy_port_is_no_matter(tmp_path):
    """On one machine the agent's store takes a free port the OS keeps for the run (two runs
    started at once never collide: test_ddp.py); dist.dist_url is for several machines."""
    from helpers.ddp import ordered_sum_rank, tiny_cfg

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        cfg = tiny_cfg(tmp_path, "dist.gpus=2", f"dist.dist_url=127.0.0.1:{busy.getsockname()[1]}")
        assert spawn.run_ranks(cfg, tmp_path / "run", ordered_sum_rank)["ordered"] == [1.0, 1.0]


@pytest.mark.parametrize("url", ["localhost", "10.0.0.1:", "h:99999", "h:port"])
def test_bad_dist_url_names_the_key(url):
    """One parser for the config check and the rendezvous: the same line from both."""
    with pytest.raises(ConfigError, match="dist.dist_url") as parsed:
        parse_dist_url(url)
    with pytest.raises(ConfigError) as checked:
        check_dist(OmegaConf.merge(compose([]), {"dist": {"dist_url": url}}))
    assert str(parsed.value) == str(checked.value)
    assert parse_dist_url("tcp://10.0.0.1:29500") == ("10.0.0.1", 29500)


def test_small_dev_shm_warns_with_the_fix(monkeypatch, caplog, tmp_path):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(spawn.shutil, "disk_usage", lambda p: usage(64 << 20, 0, 64 << 20))
    with caplog.at_level(logging.WARNING):
        assert spawn.check_shm(4, str(tmp_path)) is False
    assert "only 64 MB free" in caplog.text and "--shm-size" in caplog.text
    assert "trainer.num_workers=0" in caplog.text
    caplog.clear()
    assert spawn.check_shm(0, str(tmp_path)) is True  # no workers: no shared memory used
    monkeypatch.setattr(spawn.shutil, "disk_usage", lambda p: usage(8 << 30, 0, 8 << 30))
    assert spawn.check_shm(4, str(tmp_path)) is True and not caplog.text


@pytest.mark.parametrize("world", [2, 4])
def test_global_batch_is_split_into_contiguous_rank_slices(world):
    ref = list(GlobalBatchSampler(40, 8, 0, 1, seed=3))
    parts = [list(GlobalBatchSampler(40, 8, r, world, seed=3)) for r in range(world)]
    assert all(len(b) == 8 // world for p in parts for b in p)
    for g, batch in enumerate(ref):
        assert sum((p[g] for p in parts), []) == batch
    with pytest.raises(ValueError, match="trainer.batch_size=8"):
        GlobalBatchSampler(40, 8, 0, 3, seed=3)


def test_sync_bn_converts_the_bn_preset(tmp_path):
    from helpers.ddp import tiny_cfg

    from mdk import dist
    from mdk.models.build import build_model
    from mdk.sync_bn import GlobalBatchNorm2d

    cfg = tiny_cfg(tmp_path, "model=gnetdet_small")  # the small preset has BN
    model = build_model(cfg).double()
    n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert n_bn == 6  # one per hidden conv; the output conv has none
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model.layers[0].bn.weight
    conv = dist.convert_sync_bn(model, torch.device("cpu"))  # CPU: the gloo-capable module
    assert sum(isinstance(m, GlobalBatchNorm2d) for m in conv.modules()) == n_bn
    assert not any(type(m) is torch.nn.BatchNorm2d for m in conv.modules())
    after = conv.state_dict()  # same keys, dtypes and values: checkpoints do not notice
    assert after.keys() == before.keys()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    assert conv.layers[0].bn.weight is weight  # the very parameter, as torch's conversion does
    bn_free = build_model(tiny_cfg(tmp_path, "model.net.batch_norm=false"))
    assert dist.convert_sync_bn(bn_free, torch.device("cpu")) is bn_free


@pytest.mark.parametrize("rank", [0, 1])
def test_env_started_rank_that_cannot_meet_the_others_names_master_addr(rank, monkeypatch,
                                                                        tmp_path):
    """RANK/WORLD_SIZE/MASTER_* set by torchrun or another launcher: rank 1 facing a closed
    port, or rank 0 left alone, ends in one RendezvousError naming the address and what to
    check, after dist.timeout_s, not a torch traceback or a hang."""
    from launchers.processes.env import ProcessEnv
    from helpers.ddp import tiny_cfg

    port = _closed_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    cfg = tiny_cfg(tmp_path, "dist.timeout_s=2")
    env = ProcessEnv("torchrun", rank, rank, 2, "127.0.0.1", port)
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as e:
        join(cfg, tmp_path, lambda c, d, w: {}, env)
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert f"rank {rank} of 2" in msg and f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{port}" in msg
    assert "dist.timeout_s=2" in msg and "firewall" in msg
    if rank == 0:
        assert "1/2 clients joined" in msg  # torch's count of who arrived, passed on
