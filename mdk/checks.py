"""The value checks every config group's owner uses: an integer >= n, a number > 0, one word of a
list, a map of ``_target_`` nodes. Each raises a ConfigError whose message names the key and says
what to write. A leaf: no torch, nothing of mdk but the errors.
"""
from __future__ import annotations

from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError, import_target


def get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def check_min(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> None:
    """An integer >= minimum (also type-checked here: the checks run on plain configs too)."""
    v = get(cfg, key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key}={v!r} must be an integer (e.g. {key}={max(minimum, 1)})")
    if v < minimum:
        raise ConfigError(f"{key}={v} must be >= {minimum}")


def check_positive(cfg: DictConfig, key: str, optional: bool = False) -> None:
    v = get(cfg, key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{key}={v!r} must be a number")
    if not v > 0:  # also rejects nan
        raise ConfigError(f"{key}={v} must be > 0" + (" (or null to turn it off)" if optional else ""))


def check_one_of(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    v = get(cfg, key)
    if str(v) not in allowed:
        raise ConfigError(f"{key}={v!r} must be {', '.join(allowed[:-1])} or {allowed[-1]}")


def target_nodes(nodes: Any, key: str, what: str, example: str, map_hint: str = ""
                 ) -> Iterator[tuple[str, type, dict[str, Any]]]:
    """(``<key>.<name>``, its class, its options) of every node of the map at ``key`` that is on
    (a null node is off): the sinks of ``logger.sinks``, the hooks of ``trainer.hooks``. ``what``
    names a node's class in messages ("sink"), ``example`` is a class path to show."""
    if nodes is None:
        nodes = {}
    if not hasattr(nodes, "items"):
        raise ConfigError(f"{key}={nodes!r} must be a map of {what} nodes (each with a "
                          f"_target_){map_hint}; {{}} for none")
    for name, node in nodes.items():
        where = f"{key}.{name}"
        if node is None:  # <key>.<name>=null turns one node off
            continue
        if not hasattr(node, "items") or "_target_" not in node:
            raise ConfigError(f"{where}={node!r} needs a _target_ (the {what} class), e.g. "
                              f"{where}._target_={example}")
        plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
        cls = import_target(node["_target_"], f"{where}._target_",
                            f"give a class path such as {example}")
        yield where, cls, {str(k): v for k, v in plain.items() if k != "_target_"}
