"""The ``paths`` config group: its schema, the ``mdk_ckpt`` resolver behind the default
checkpoint root, and how a configured path is read. A leaf: imported before anything is composed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import MISSING, OmegaConf


@dataclass
class PathsConf:
    data: str = "outputs/data"
    checkpoints: str = MISSING


SCHEMAS: dict[str, type] = {"paths": PathsConf}


def resolve_path(p: str | Path, root: str | Path) -> Path:
    """Absolute paths as given; relative ones under ``root`` (the cwd; it is never changed)."""
    p = Path(str(p)).expanduser()
    return p if p.is_absolute() else Path(root) / p


def _ckpt_root(single_run_default: str) -> str:
    """A single run: the stable default folder (stage N+1 finds stage N's best). A sweep job:
    ``<job dir>/checkpoints``, so jobs never write into each other's checkpoints."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return str(Path(HydraConfig.get().runtime.output_dir) / "checkpoints")
    return single_run_default  # also without a Hydra run (the compose API in tests and tools)


def register_resolvers() -> None:
    """Idempotent; every entry point calls it before a config is read."""
    if not OmegaConf.has_resolver("mdk_ckpt"):
        OmegaConf.register_new_resolver("mdk_ckpt", _ckpt_root)
