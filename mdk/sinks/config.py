"""The ``logger`` config group: its schema and checks (conf/logger/*.yaml). Torch-free: the schema
loads before Hydra composes.

A logger config holds ``log_every`` and a map ``sinks: {name: {_target_: class, options...}}``;
``logger=none`` has an empty map, ``logger=[tensorboard,wandb]`` merges both maps, and
``logger.sinks.<name>=null`` turns one off.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from omegaconf import DictConfig

from mdk.checks import check_min
from mdk.targets import build, target_nodes

# What every sink's constructor gets besides its YAML options (mdk.sinks.build_sinks).
SINK_ARGS = ("run_dir", "stage", "group", "resume_step", "config")


@dataclass
class LoggerConf:
    log_every: int = 10
    sinks: dict[str, Any] = field(default_factory=dict)


SCHEMAS: dict[str, type] = {"logger": LoggerConf}


def sink_nodes(logger_cfg: Any) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(``logger.sinks.<name>``, its node, ``build``'s hint) of every sink that is on."""
    nodes = logger_cfg.get("sinks") if hasattr(logger_cfg, "get") else None
    return target_nodes(nodes, "logger.sinks", "sink",
                        "mdk.sinks.tensorboard_sink.TensorBoardSink", ", e.g. logger=tensorboard")


def check_logger(cfg: DictConfig) -> None:
    """``logger.log_every``, and every sink node: its class imports and takes its options."""
    check_min(cfg, "logger.log_every", 1)
    for where, node, hint in sink_nodes(cfg.logger):
        build(node, where, hint=hint, check=True, **dict.fromkeys(SINK_ARGS))
