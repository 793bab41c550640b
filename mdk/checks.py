"""The value checks every config group's owner uses: an integer >= n, a number > 0, one word of a
list. Each raises a ConfigError whose message names the key and says what to write. A leaf: no
torch, nothing of mdk but the errors.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError


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
