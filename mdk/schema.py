"""The registry of typed config schemas (Hydra structured configs), one entry per config group.

Each schema sits in its group owner's config module (torch-free: this loads before Hydra
composes). A group's YAML starts with ``defaults: [/_schema_<group>_<name>@_here_, _self_]``, so
an unknown key or a wrong type fails at compose time naming the key; ranges and cross-key checks
are the owners' (mdk.config). ``Any`` marks keys that take a word or a number (``auto | 4``).
"""
from __future__ import annotations

from hydra.core.config_store import ConfigStore
from hydra.core.object_type import ObjectType

from mdk import dist_config, paths, stage_config, trainer_config
from mdk.data import config as data_config
from mdk.models import config as models_config
from mdk.sched import config as sched_config
from mdk.sinks import config as sinks_config

SCHEMAS: dict[str, dict[str, type]] = {
    "trainer": trainer_config.TRAINER_SCHEMAS,
    "optim": trainer_config.OPTIM_SCHEMAS,
    "dist": dist_config.SCHEMAS,
    "paths": paths.SCHEMAS,
    "step": stage_config.SCHEMAS,
    "scheduler": sched_config.SCHEMAS,
    "model": models_config.MODEL_SCHEMAS,
    "loss": models_config.LOSS_SCHEMAS,
    "head": models_config.HEAD_SCHEMAS,
    "dataset": data_config.SCHEMAS,
    "logger": sinks_config.SCHEMAS,
}


def schema_name(group: str, name: str) -> str:
    """A top-level ConfigStore name, not a group, so ``--help`` does not list schemas as groups."""
    return f"_schema_{group}_{name}"


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore; idempotent, must run before Hydra composes."""
    cs = ConfigStore.instance()
    for group, items in SCHEMAS.items():
        for name, node in items.items():
            # Each compose calls this: storing converts the dataclass again (~0.1 s in all).
            if cs.get_type(f"{schema_name(group, name)}.yaml") != ObjectType.CONFIG:
                cs.store(name=schema_name(group, name), node=node)
