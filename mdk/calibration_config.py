"""A stage's ``step.calibration`` node: the calibration method as a ``_target_`` node of a
mdk.quant.calibrate.CapObserver subclass whose constructor takes (and checks) the node's keys
(conf/step/calibration/; docs/pipeline.md, Calibration methods).

``calibration_node`` is the one reader of every spelling: the node itself; a word naming an
option of conf/step/calibration/ (``+stages.<stage>.calibration=kl``); and the record of
checkpoints and commands from before the methods were nodes, ``{method: kl, percentile: 99.0,
mse_candidates: 64, max_values: 1048576}``: the method's class with the values it takes (the
others were never read by it). ``observers`` builds the node with the process's ``rank`` /
``world``; ``with_calibration_node`` builds it once per stage config, before any stage runs.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf

from mdk.compose import compose, group_options
from mdk.checks import BadValue
from mdk.errors import ConfigError
from mdk.quant.calibrate import KEY, CapObserver
from mdk.targets import build

GROUP = "step/calibration"
CODE_ARGS = ("rank", "world")  # given by the code that builds an observer, never by the config
# The words of records written before the methods were nodes (mdk.quant.calibrate.METHODS then):
# fixed, as those records are; a method today is an option of GROUP.
OLD_WORDS = {"percentile": "mdk.quant.calibrate.PercentileCap", "max": "mdk.quant.calibrate.MaxCap",
             "mse": "mdk.quant.calibrate.MseCap", "kl": "mdk.quant.calibrate.KlCap"}


# build's hint for a class path that does not import: fixed text (listing the options costs a
# Hydra search, ~0.2 s, so only the lines below that refuse a node list them)
CLASS_HINT = ("give pkg.module.Name of a mdk.quant.calibrate.CapObserver subclass, or name an "
              "option of conf/step/calibration/ (step/calibration=<name>; in a pipeline "
              "+stages.<stage>.calibration=<name>)")


def methods_hint() -> str:
    return (f"use one of {', '.join(group_options(GROUP))} (step/calibration=<name>; in a pipeline "
            f"+stages.<stage>.calibration=<name>) or {KEY}._target_=pkg.module.Name of a "
            "mdk.quant.calibrate.CapObserver subclass")


def _plain(c: Any) -> Any:
    return OmegaConf.to_container(c, resolve=True) if isinstance(c, DictConfig) else c


def option_node(word: str, where: str = "") -> dict[str, Any]:
    """The node of option ``word`` of conf/step/calibration/ (one on ``hydra.searchpath`` too)."""
    if word not in group_options(GROUP):
        raise ConfigError(f"{KEY}={word!r}{where} is not a calibration method; {methods_hint()}")
    return _plain(compose([f"+{GROUP}={word}"], config_name=None).step.calibration)


def _takes(target: str) -> Optional[set[str]]:
    """The keys the class at ``target`` takes from a node (None: any, it has ``**kwargs``)."""
    params = inspect.signature(build(target, f"{KEY}.method", check=True,
                                     hint=CLASS_HINT)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.name not in CODE_ARGS}


def calibration_node(c: Any, where: str = "") -> Optional[dict[str, Any]]:
    """The ``_target_`` node (plain values) that ``c``, a stage's ``calibration`` in any spelling,
    stands for; None for none. ``where``: the stage, for messages (`` (cal)``)."""
    c = _plain(c)
    if c is None:
        return None
    if isinstance(c, str):
        return option_node(c, where)
    if not isinstance(c, dict):
        raise ConfigError(f"{KEY}={c!r}{where} must be a node with a _target_ or the name of an "
                          f"option; {methods_hint()}")
    if "method" not in c:
        return c
    method = str(c.pop("method"))  # a record from before the nodes (or +step.calibration.method=)
    target = OLD_WORDS.get(method) or (method if "." in method else None)
    if target is None:
        raise ConfigError(f"{KEY}.method={method!r}{where} is not a calibration method; "
                          f"{methods_hint()}")
    takes = _takes(target)
    return {"_target_": target, **{k: v for k, v in c.items()
                                   if k != "_target_" and (takes is None or k in takes)}}


_CLASSES: dict[str, type] = {}  # repr(node) -> its class, checked: a check costs an instantiate


def _checked_class(node: dict[str, Any], where: str) -> type:
    """The CapObserver subclass of ``node``, once it imports and takes the node's keys (checked
    once per process: each stage config of a command checks its node)."""
    key = repr(node)
    if key not in _CLASSES:
        cls = build(node, KEY, hint=CLASS_HINT, check=True, rank=0, world=1)
        if not (isinstance(cls, type) and issubclass(cls, CapObserver)):
            raise ConfigError(f"{KEY}._target_={node['_target_']!r}{where} is not a calibration "
                              f"method; {methods_hint()}")
        _CLASSES[key] = cls
    return _CLASSES[key]


def observers(c: Any, *, rank: int = 0, world: int = 1, where: str = ""
              ) -> Callable[[], CapObserver]:
    """What makes a fresh observer of the node ``c`` (any spelling) for this process's slice of
    each global batch, checked by building one; a bad node or value is one ConfigError naming the
    key (and ``where``)."""
    node = calibration_node(c, where)
    if node is None or "_target_" not in node:
        raise ConfigError(f"{KEY}={node!r}{where} needs a _target_; {methods_hint()}")
    given = [k for k in CODE_ARGS if k in node]
    if given:
        raise ConfigError(f"{KEY}.{given[0]}{where} is not a setting: each process's share of a "
                          "batch is given by mdk; drop the key")
    cls = _checked_class(node, where)
    # the node's plain values, as build passes them
    make = functools.partial(cls, **{k: v for k, v in node.items() if k != "_target_"},
                             rank=rank, world=world)
    try:
        make()  # its constructor checks the values
    except BadValue as e:  # the class's own check (mdk/checks.py): the stage after the value
        raise ConfigError(e.at(where)) from None
    except ValueError as e:  # another refusal of the class: one line, as build gives it
        raise ConfigError(f"{KEY} ({node['_target_']}){where}: {e}") from e
    return make


def with_calibration_node(cfg: DictConfig, stage: str) -> DictConfig:
    """``cfg`` (not mutated) with ``step.calibration`` as the node it stands for, checked: what the
    stage runs, records in its checkpoints' ``hparams`` and compares on resume."""
    raw = cfg.step.get("calibration")
    if raw is None:
        return cfg
    where = f" ({stage})"
    node = calibration_node(raw, where)
    observers(node, where=where)
    if OmegaConf.is_dict(raw) and _plain(raw) == node:
        return cfg
    return OmegaConf.merge(cfg, {"step": {"calibration": None}}, {"step": {"calibration": node}})
