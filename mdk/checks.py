"""The value checks every config group's owner uses, each raising a ConfigError that names the key
and says what to write (``_target_`` nodes are built by mdk/targets.py). A leaf: no torch,
nothing of mdk but the errors.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError


def get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def check_min(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> None:
    """An integer >= minimum (type-checked too: the checks also run on plain configs)."""
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


def one_of(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` of ``key`` if it is one of ``allowed`` words: the one check of a word list, for
    the config check and for the code that takes the value (the same line from either)."""
    if str(value) not in allowed:
        raise ConfigError(f"{key}={value!r} must be {', '.join(allowed[:-1])} or {allowed[-1]}")
    return str(value)


def check_one_of(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    one_of(key, get(cfg, key), allowed)
