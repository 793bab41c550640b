"""Training hooks named by config: ``trainer.hooks: {name: {_target_: pkg.module.Class, ...}}``.

A hook from outside the library (e.g. launchers/hydra_app/optuna_trial.py) thus runs in the loop
without the engine importing it. Each is built as ``cls(stage=, run_dir=, is_main=, so_far=,
**options)`` on every rank and registered after the checkpoint hook (the epoch's checkpoints are
written when its ``after_epoch`` runs).

* ``so_far()``: the stage's numbers so far under ``StageResult``'s names (``best_map50``: None
  before any evaluation; ``final_loss``: the training loss of the last log step);
* to end training early a hook sets ``trainer.stop = True`` and ``trainer.stop_reason`` on every
  rank at the same epoch (agreeing across ranks itself); the result then gets ``stopped_epoch``
  and ``stop_reason``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from mdk.targets import build, target_nodes
from mdk.engine.loop import HookBase
from mdk.errors import ConfigError


def build_extra_hooks(nodes: Any, *, stage: str, run_dir: Path, is_main: bool,
                      so_far: Callable[[], Mapping[str, Any]]) -> list[HookBase]:
    hooks = []
    for where, node, hint in target_nodes(nodes, "trainer.hooks", "hook", "pkg.module.MyHook"):
        hook = build(node, where, hint=hint, stage=stage, run_dir=Path(run_dir), is_main=is_main,
                     so_far=so_far)
        if not isinstance(hook, HookBase):
            raise ConfigError(f"{where}._target_={node['_target_']} is not a training hook "
                              "(mdk.engine.loop.HookBase)")
        hooks.append(hook)
    return hooks
