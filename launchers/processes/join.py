"""Join a run whose processes something else started: torchrun, SLURM (submitit), submitit_local.

Each of those processes went through Hydra itself, so rank 0's resolved config and run dir are
broadcast and used by every rank (one process resolves the run), and every rank returns rank 0's
result (entry code that writes a summary then writes the same one). The World comes from the
environment read once by launchers/processes/env.py: its world size is the real one, whatever
``dist.gpus * dist.nodes`` says, and the config checks that depend on it run against it.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch.distributed as tdist
from omegaconf import DictConfig, OmegaConf

from launchers.processes.env import ProcessEnv
from launchers.processes.rank_logs import remove_rank_file_handler, setup_worker_logging
from launchers.processes.rendezvous import RendezvousError, host_store, init_group
from mdk.dist_config import check_world
from mdk.world import World, make_world

log = logging.getLogger(__name__)

StageFn = Callable[[DictConfig, Path, World], dict]


def _init_torchrun(world: World, env: ProcessEnv, timeout: float) -> None:
    # torchrun's agent already hosts a store at MASTER_ADDR:MASTER_PORT; env:// reuses it.
    try:
        tdist.init_process_group(world.backend, init_method="env://", rank=env.rank,
                                 world_size=env.world_size, timeout=timedelta(seconds=timeout))
    except (RuntimeError, OSError) as e:  # torch's DistNetworkError / DistStoreError
        raise RendezvousError(
            f"rank {env.rank} of {env.world_size}: could not meet the other ranks at "
            f"MASTER_ADDR:MASTER_PORT={env.master_addr}:{env.master_port} (from the "
            f"environment: torchrun or the launcher that set RANK/WORLD_SIZE) within "
            f"dist.timeout_s={timeout:g}: {str(e).splitlines()[0].rstrip('.')}. Check that "
            "the rank-0 process is running, that every process got the same MASTER_ADDR, MASTER_PORT "
            "and WORLD_SIZE, and that the port is reachable from this machine (firewall, "
            "VPN, a network interface that is not the default one)") from e


def join_external(cfg: DictConfig, run_dir: Path, fn: StageFn, env: ProcessEnv) -> dict:
    """Join the process group of an externally started run and run ``fn`` on this rank."""
    timeout = float(cfg.dist.timeout_s)
    world = make_world(env.rank, env.local_rank, env.world_size, env.local_world_size,
                       cfg.trainer.device, cfg.dist.backend)
    check_world(cfg, world.size)  # the real world size: batch split, exact chunks
    if env.source == "torchrun":
        _init_torchrun(world, env, timeout)
    else:
        addr, port = env.master_addr or "127.0.0.1", env.master_port or 29500
        store = host_store(f"{addr}:{port}", 2, timeout)[0] if env.rank == 0 else None
        init_group(world.backend, env.rank, env.world_size, addr, port, timeout,
                   f"mdk/{cfg.step.name}", store)
    try:
        box = [(OmegaConf.to_container(cfg, resolve=True), str(run_dir))]
        tdist.broadcast_object_list(box, src=0)
        cfg, run_dir = OmegaConf.create(box[0][0]), Path(box[0][1])
        setup_worker_logging(run_dir, env.rank, keep_existing=env.rank == 0)
        if env.rank == 0:
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
        # ("terminate called without an active exception") and fail the whole torchrun job.
        tdist.barrier()
        return out[0]
    finally:
        remove_rank_file_handler(env.rank)
        tdist.destroy_process_group()
