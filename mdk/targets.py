"""``build``: the one way a ``_target_`` node of the config (model, head, loss, optimizer,
scheduler, reader, generator, sinks, hooks, a stage's ``kind``, the search's sampler and pruner)
becomes an object, or is checked before any work, with one line naming the key for what it
refuses; ``target_nodes``: the nodes of a map of them. A leaf: no torch, nothing of mdk but the
errors.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Iterator

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError, UserError


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
