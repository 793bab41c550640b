"""The ``dist`` config group: its schema, the backend words (mdk/world.py resolves them) and its
checks. Torch-free: the schema loads before Hydra composes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig

from mdk.checks import check_min, check_positive, one_of
from mdk.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")    # dist.backend


@dataclass
class DistConf:
    gpus: int = 1
    nodes: int = 1
    rank: int = 0
    dist_url: str = "auto"
    sync_bn: bool = False
    backend: str = "auto"
    timeout_s: float = 60.0
    exact_chunk: Optional[int] = None
    cpu_threads: Any = "auto"


SCHEMAS: dict[str, type] = {"dist": DistConf}


def parse_dist_url(url: str) -> tuple[str, int]:
    """``[tcp://]host:port`` -> (host, port): the one parser of ``dist.dist_url``."""
    host, sep, port = str(url).removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"dist.dist_url={url!r} must be host:port with a port in 1..65535 "
                          "(e.g. dist.dist_url=10.0.0.1:29500), or auto on one machine")
    return host, int(port)


def check_backend(backend: Any) -> str:
    return one_of("dist.backend", backend, BACKENDS)


def check_batch_divides(batch: int, world: int, where: str = "the world size") -> None:
    if batch % world:
        raise ConfigError(f"trainer.batch_size={batch} is the global batch and must divide by "
                          f"{where}={world}")


def check_split(batch: int, world: int, chunk: Optional[int],
                where: str = "the world size") -> None:
    """The global batch splits over ``world`` processes, and each part into ``chunk``s
    (``dist.exact_chunk``): for a run's config and for the alignment tool's worlds."""
    check_batch_divides(batch, world, where)
    if chunk is not None and (batch // world) % chunk:
        raise ConfigError(
            f"dist.exact_chunk={chunk} must divide the per-process batch trainer.batch_size/"
            f"world = {batch}/{world} = {batch // world}; "
            f"to compare world sizes up to W use exact_chunk = batch_size/W or a divisor of it")


def check_world(cfg: DictConfig, world_size: Optional[int] = None) -> None:
    """Checks on the world size: the launcher's real one when given (torchrun, SLURM), else the
    configured one."""
    world = int(world_size or cfg.dist.gpus * cfg.dist.nodes)
    where = ("the world size dist.gpus*dist.nodes" if world_size is None
             else "the world size (processes started by the launcher)")
    check_split(int(cfg.trainer.batch_size), world, cfg.dist.get("exact_chunk"), where)


def check_dist(cfg: DictConfig, world_size: Optional[int] = None) -> None:
    d = cfg.dist
    for key, lo in (("gpus", 1), ("nodes", 1), ("rank", 0)):
        check_min(cfg, f"dist.{key}", lo)
    check_positive(cfg, "dist.timeout_s")
    if str(d.dist_url) != "auto":
        parse_dist_url(str(d.dist_url))
    check_backend(d.backend)
    if d.rank >= d.nodes:
        raise ConfigError(f"dist.rank={d.rank} must be < dist.nodes={d.nodes} "
                          "(machine ranks count from 0)")
    if d.nodes > 1 and str(d.dist_url) == "auto":
        raise ConfigError("dist.dist_url=auto only works on one machine; with dist.nodes>1 give "
                          "machine 0's address on every machine, e.g. dist.dist_url=10.0.0.1:29500")
    check_min(cfg, "dist.exact_chunk", 1, optional=True)
    check_world(cfg, world_size)
    threads = d.get("cpu_threads", "auto")
    if threads != "auto" and (isinstance(threads, bool) or not isinstance(threads, int)
                              or threads < 1):
        raise ConfigError(f"dist.cpu_threads={threads!r} must be auto or an integer >= 1 "
                          "(e.g. dist.cpu_threads=1)")
