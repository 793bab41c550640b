"""The value checks every config group's owner and every class built from a config node use: one
line ``<key>=<value> must be ...`` (a ConfigError, also a ValueError) naming the key and saying
what to write (``_target_`` nodes are built by mdk/targets.py). ``integer``, ``number`` and
``one_of`` check a value where the code takes it (a constructor); ``check_*`` read it from a
config first. A leaf: no torch, nothing of mdk but the errors.
"""
from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError


class BadValue(ConfigError):
    """``<key>=<value> <why>``: a value the code that takes it refuses (made by ``of``). ``at(where)``
    is the same line with ``where`` (e.g. the stage, `` (step3)``) after the value, for a caller
    that knows it."""

    key: str = ""
    value: Any = None
    why: str = ""

    @classmethod
    def of(cls, key: str, value: Any, why: str) -> "BadValue":
        e = cls(f"{key}={value!r} {why}")
        e.key, e.value, e.why = key, value, why
        return e

    def at(self, where: str = "") -> str:
        return f"{self.key}={self.value!r}{where} {self.why}" if self.key else str(self)


def is_number(v: object) -> bool:
    """An int or float from the config (YAML's true/false are bools, not numbers here)."""
    return not isinstance(v, bool) and isinstance(v, (int, float))


def integer(key: str, value: Any, minimum: int, more: str = "") -> int:
    """``value`` if it is an integer >= ``minimum`` (``more``: what else the line says)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadValue.of(key, value, f"must be an integer >= {minimum}{more}")
    return value


def number(key: str, value: Any, low: float, high: float | None = None, *,
           low_open: bool = False, what: str = "a number", more: str = "") -> float:
    """``value`` as a float if it is a finite number >= ``low`` (> with ``low_open``) and <=
    ``high`` if given; ``what`` names it in the line ("an IoU"), ``more`` says what else it may
    be."""
    ok = is_number(value) and math.isfinite(value) and (value > low if low_open else value >= low)
    if ok and high is not None:
        ok = value <= high
    if not ok:
        left = "(" if low_open else "["
        bounds = (f" in {left}{low:g}, {high:g}]" if high is not None
                  else f" {'>' if low_open else '>='} {low:g}")
        raise BadValue.of(key, value, f"must be {what}{bounds}{more}")
    return float(value)


def get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def check_min(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> None:
    """``integer`` on the config's value (``optional``: null is allowed too)."""
    v = get(cfg, key)
    if not (v is None and optional):
        integer(key, v, minimum)


def check_positive(cfg: DictConfig, key: str, optional: bool = False) -> None:
    """``number`` > 0 on the config's value (``optional``: null turns the setting off)."""
    v = get(cfg, key)
    if not (v is None and optional):
        number(key, v, 0, low_open=True, more=" (or null to turn it off)" if optional else "")


def one_of(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` of ``key`` if it is one of ``allowed`` words: the one check of a word list, for
    the config check and for the code that takes the value (the same line from either)."""
    if str(value) not in allowed:
        raise BadValue.of(key, value, f"must be {', '.join(allowed[:-1])} or {allowed[-1]}")
    return str(value)


def check_one_of(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    one_of(key, get(cfg, key), allowed)
