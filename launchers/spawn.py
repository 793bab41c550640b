"""Start the ranks of a run: in this process, as local workers, or inside torchrun/SLURM tasks.

The parent resolves the config and the run directory once and hands a plain (resolved) config to
every rank, so no worker ever re-resolves Hydra interpolations or picks its own run dir.
"""
from __future__ import annotations

import json
import logging
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as tdist
from omegaconf import DictConfig, OmegaConf

from launchers.env import ProcessEnv, detect
from launchers.logs import setup_worker_logging

log = logging.getLogger(__name__)

StageFn = Callable[[DictConfig, Path], dict]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(cfg: DictConfig) -> str:
    b = str(cfg.dist.backend)
    if b != "auto":
        return b
    return "nccl" if torch.cuda.is_available() and cfg.trainer.device != "cpu" else "gloo"


def _init_group(cfg: DictConfig, rank: int, world: int, addr: str, port: int) -> None:
    tdist.init_process_group(backend_for(cfg), init_method=f"tcp://{addr}:{port}", rank=rank,
                             world_size=world, timeout=timedelta(seconds=int(cfg.dist.timeout_s)))


def _worker(local_rank: int, fn: StageFn, plain: dict, run_dir: str, addr: str, port: int,
            result_file: str) -> None:
    cfg = OmegaConf.create(plain)
    world = cfg.dist.gpus * cfg.dist.nodes
    rank = cfg.dist.rank * cfg.dist.gpus + local_rank
    os.environ["LOCAL_RANK"] = str(local_rank)
    setup_worker_logging(Path(run_dir), rank)
    # One thread per worker: N workers on N cores, not N x N threads fighting for them.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.dist.gpus))
    _init_group(cfg, rank, world, addr, port)
    try:
        out = fn(cfg, Path(run_dir))
        if rank == 0:
            Path(result_file).write_text(json.dumps(out, default=str))
    finally:
        tdist.destroy_process_group()


def run_ranks(cfg: DictConfig, run_dir: Path, fn: StageFn) -> dict:
    """Run ``fn(cfg, run_dir)`` on every rank of this machine; return rank 0's result."""
    env: ProcessEnv = detect()
    world = cfg.dist.gpus * cfg.dist.nodes
    if env.external:
        if env.world_size != world:
            log.info("world size %d comes from %s (dist.gpus*dist.nodes=%d is ignored)",
                     env.world_size, env.source, world)
        os.environ["LOCAL_RANK"] = str(env.local_rank)
        _init_group(cfg, env.rank, env.world_size, env.master_addr or "127.0.0.1",
                    env.master_port or 29500)
        try:
            return fn(cfg, run_dir)
        finally:
            tdist.destroy_process_group()
    if world == 1:
        return fn(cfg, run_dir)
    if not torch.cuda.is_available() or cfg.trainer.device == "cpu":
        log.info("no CUDA: running %d CPU worker processes with gloo", cfg.dist.gpus)
    if str(cfg.dist.dist_url) == "auto":
        addr, port = "127.0.0.1", free_port()
    else:
        addr, _, p = str(cfg.dist.dist_url).rpartition(":")
        port = int(p)
    result_file = run_dir / f".result_{cfg.step.name}_{os.getpid()}.json"
    plain = OmegaConf.to_container(cfg, resolve=True)
    torch.multiprocessing.start_processes(
        _worker, args=(fn, plain, str(run_dir), addr, port, str(result_file)),
        nprocs=cfg.dist.gpus, join=True, start_method="spawn")
    if cfg.dist.rank != 0:
        return {"stage": cfg.step.name, "rank": cfg.dist.rank}
    out = json.loads(result_file.read_text())
    result_file.unlink(missing_ok=True)
    return out
