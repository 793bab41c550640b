"""The value checks every config group's owner uses, each raising a ConfigError that names the key
and says what to write; and ``build``, the one way a ``_target_`` node becomes an object. A leaf:
no torch, nothing of mdk but the errors.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Iterator

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError, UserError


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


def build(node: Any, key: str, *args: Any, error: type[Exception] = ConfigError,
          hint: str = "give a class path as package.module.Class", check: bool = False,
          **kwargs: Any) -> Any:
    """What the ``_target_`` node at ``key`` builds with the runtime ``args``/``kwargs``; ``node``
    may also be a dotted name alone. ``check``: nothing built, the target returned once it imports
    (and the arguments bind to its signature). A target that does not import (``hint``: what to
    write) or arguments it does not take are one ``error`` line naming ``key``; a ValueError it
    raises is one ConfigError line; its own user errors and bugs propagate."""
    where, node = (key, {"_target_": node}) if isinstance(node, str) else (f"{key}._target_", node)
    target = node.get("_target_")
    module, _, attr = str(target).rpartition(".")
    try:
        getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise error(f"{where}={target!r} cannot be imported ({e}); {hint}") from None
    try:
        plain = {"_convert_": "all", "_recursive_": False} if isinstance(node, dict) else {}
        made = instantiate(node, _partial_=True, **plain)
        if check and not (args or kwargs):
            return made.func
        try:
            inspect.signature(made.func).bind(*made.args, *args, **{**made.keywords, **kwargs})
        except TypeError as e:
            raise error(f"{key}: {target} does not take these keys ({e}); set only the keys it "
                        "takes (see its docstring)") from None
        except ValueError:  # a builtin without a signature: its call says
            pass
        return made.func if check else made(*args, **kwargs)
    except (ValueError, InstantiationException) as e:
        cause = e.__cause__ if isinstance(e, InstantiationException) else e
        if isinstance(e, UserError) or not isinstance(cause, ValueError):
            raise
        text = str(cause)  # named by the class's own message (``model.image_size=...``) or here
        where = "" if text.startswith(key.split(".")[0] + ".") else f"{key} ({target}): "
        raise ConfigError(where + text) from cause


def target_nodes(nodes: Any, key: str, what: str, example: str, map_hint: str = ""
                 ) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(``<key>.<name>``, the node as plain values, ``build``'s hint) of every non-null node of the
    map at ``key`` (e.g. ``logger.sinks``). ``what`` names a node's class in messages ("sink"),
    ``example`` is a class path to show."""
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
        yield (where, OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig)
               else dict(node), f"give a class path such as {example}")
