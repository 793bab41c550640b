"""Training hooks named by config: ``trainer.hooks: {name: {_target_: pkg.module.Class, ...}}``.

The engine builds them for every training stage, like the metric sinks, so a hook from outside
the library (a search's trial reporter, launchers/hydra_app/optuna_trial.py) runs in the loop
without the engine importing it. Each is constructed as ``cls(stage=, run_dir=, is_main=,
so_far=, **options)`` on every rank and registered after the checkpoint hook: at its
``after_epoch`` the epoch's last.pth (and best.pth) are written.

* ``so_far()``: the stage's numbers so far under the names of ``StageResult``
  (``best_map50``: the best val mAP@0.5 up to this epoch, None before any evaluation;
  ``final_loss``: the training loss of the last log step);
* a hook that ends training early sets ``trainer.stop = True`` and ``trainer.stop_reason`` on
  every rank at the same epoch (it agrees across ranks itself): the loop leaves after that epoch,
  and the stage's result gets ``stopped_epoch`` and ``stop_reason``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from omegaconf import DictConfig, OmegaConf

from mdk.engine.loop import HookBase
from mdk.errors import ConfigError, import_target


def hook_nodes(nodes: Any) -> list[tuple[str, type, dict[str, Any]]]:
    """(``trainer.hooks.<name>``, class, options) of each hook that is on (a null node is off)."""
    if nodes is None:
        return []
    if not hasattr(nodes, "items"):
        raise ConfigError(f"trainer.hooks={nodes!r} must be a map of hook nodes (each with a "
                          "_target_); {} for none")
    out = []
    for name, node in nodes.items():
        where = f"trainer.hooks.{name}"
        if node is None:
            continue
        if not hasattr(node, "items") or "_target_" not in node:
            raise ConfigError(f"{where}={node!r} needs a _target_ (a HookBase class)")
        plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
        cls = import_target(node["_target_"], f"{where}._target_",
                            "give a class path such as pkg.module.MyHook")
        out.append((where, cls, {str(k): v for k, v in plain.items() if k != "_target_"}))
    return out


def build_extra_hooks(nodes: Any, *, stage: str, run_dir: Path, is_main: bool,
                      so_far: Callable[[], Mapping[str, Any]]) -> list[HookBase]:
    hooks = []
    for where, cls, options in hook_nodes(nodes):
        try:
            hook = cls(stage=stage, run_dir=Path(run_dir), is_main=is_main, so_far=so_far,
                       **options)
        except TypeError as e:
            raise ConfigError(f"{where}: {e}; check the options of this hook") from None
        if not isinstance(hook, HookBase):
            raise ConfigError(f"{where}._target_={node_target(cls)} is not a training hook "
                              "(mdk.engine.loop.HookBase)")
        hooks.append(hook)
    return hooks


def node_target(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
