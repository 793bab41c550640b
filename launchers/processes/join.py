"""How a rank joins its run: every rank, whoever started it (elastic agent, torchrun, SLURM),
meets the others through torch's ``env://`` rendezvous, takes rank 0's resolved config and run
dir, and returns rank 0's result (docs/distributed.md, "Starting a run"). The world size is the
environment's, whatever ``dist.gpus * dist.nodes`` says.
"""
from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch.distributed as tdist
from omegaconf import DictConfig, OmegaConf

from launchers.processes.env import ProcessEnv
from launchers.processes.log_handlers import remove_rank_file_handler, setup_worker_logging
from mdk.dist_config import check_world
from mdk.errors import UserError
from mdk.world import World, make_world

log = logging.getLogger(__name__)

StageFn = Callable[[DictConfig, Path, World], dict]

HINT = ("check that machine 0 (dist.rank=0) is running, that every machine uses the same "
        "dist.dist_url / dist.nodes / dist.gpus, and that the port is reachable from every "
        "machine (firewall, VPN, a cluster network interface that is not the default one)")


class RendezvousError(UserError, RuntimeError):
    """The ranks of a run could not meet; the message says where and what to check."""

    label = "distributed setup error"


def interface_towards(host: str, port: int) -> Optional[str]:
    """The name of this machine's network interface that packets to host:port leave through.

    None when it cannot be told (unresolvable host, a loopback route, not Linux)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))  # UDP: picks the route, sends nothing
            local = s.getsockname()[0]
        if ipaddress.ip_address(local).is_loopback:
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:  # SIOCGIFADDR: the interface's IPv4 address
                    raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
                if socket.inet_ntoa(raw[20:24]) == local:
                    return name
    except (OSError, ValueError):
        return None
    return None


def _init_group(world: World, env: ProcessEnv, timeout: float) -> None:
    addr, port = env.master_addr or "127.0.0.1", env.master_port or 29500
    os.environ.setdefault("MASTER_ADDR", addr)  # SLURM/submitit: env:// reads them
    os.environ.setdefault("MASTER_PORT", str(port))
    # gloo binds to the address this machine's hostname resolves to, and falls back to loopback
    # when that address cannot be bound (hostname mapped to 127.0.1.1, a node whose name is only
    # known to the scheduler); peers on other machines then dial 127.0.0.1 and are refused. Bind
    # to the interface that reaches the rendezvous instead, unless the user chose one.
    iface = None
    if world.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        iface = interface_towards(addr, port)
    if iface:
        log.debug("rank %d: gloo on interface %s (the route to %s)", env.rank, iface, addr)
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    try:
        tdist.init_process_group(world.backend, init_method="env://", rank=env.rank,
                                 world_size=env.world_size, timeout=timedelta(seconds=timeout))
    except (RuntimeError, OSError) as e:  # torch's DistNetworkError / DistStoreError
        raise RendezvousError(
            f"rank {env.rank} of {env.world_size}: could not meet the other ranks at "
            f"MASTER_ADDR:MASTER_PORT={addr}:{port} (from the environment: torchrun or the "
            f"launcher that set RANK/WORLD_SIZE) within dist.timeout_s={timeout:g}: "
            f"{str(e).splitlines()[0].rstrip('.')}. Check that the rank-0 process is running, "
            "that every process got the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, and that "
            "the port is reachable from this machine (firewall, VPN, a network interface that "
            "is not the default one)") from e
    finally:
        if iface:  # read when the group is made; not left behind for later groups
            del os.environ["GLOO_SOCKET_IFNAME"]


def join(cfg: DictConfig, run_dir: Path, fn: StageFn, env: ProcessEnv,
         spawned: bool = False) -> dict:
    """Join the process group of a started run and run ``fn`` on this rank. ``spawned``: a local
    rank of mdk's launcher (it set up this rank's logging), not one torchrun/SLURM started."""
    timeout = float(cfg.dist.timeout_s)
    world = make_world(env.rank, env.local_rank, env.world_size, env.local_world_size,
                       cfg.trainer.device, cfg.dist.backend)
    check_world(cfg, world.size)  # the real world size: batch split, exact chunks
    _init_group(world, env, timeout)
    try:
        # Ranks one launcher spawned got its config already; any other rank takes rank 0's
        # (another machine's launcher, torchrun and SLURM tasks composed their own), and rank 0's
        # function with what it holds (a pipeline's stage configs).
        if not (spawned and env.world_size == env.local_world_size):
            box = [(OmegaConf.to_container(cfg, resolve=True), str(run_dir), fn)]
            tdist.broadcast_object_list(box, src=0)
            cfg, run_dir, fn = OmegaConf.create(box[0][0]), Path(box[0][1]), box[0][2]
        if not spawned:
            setup_worker_logging(run_dir, env.rank, keep_existing=env.rank == 0)
        if env.rank == 0 and not spawned:
            configured = cfg.dist.gpus * cfg.dist.nodes
            if env.world_size != configured:
                log.info("world size %d comes from %s (dist.gpus*dist.nodes=%d is ignored)",
                         env.world_size, env.source, configured)
            if world.backend == "gloo":
                log.info("%s: %d CPU worker processes with gloo", env.source, env.world_size)
            else:
                log.info("%s: %d processes with %s (%s)", env.source, env.world_size,
                         world.backend, world.describe())
        out = [fn(cfg, run_dir, world)]
        tdist.broadcast_object_list(out, src=0)
        # Leave together: a rank still tearing down gloo while a peer has exited can abort
        # ("terminate called without an active exception") and fail the whole job.
        tdist.barrier()
        return out[0]
    finally:
        if not spawned:
            remove_rank_file_handler(env.rank)
        if tdist.is_initialized():
            tdist.destroy_process_group()
