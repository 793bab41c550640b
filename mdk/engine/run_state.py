"""What a training stage's last.pth holds: one mapping of named stateful parts, walked the same
way to save and to load (after torchtitan's ``states={name: Stateful}``), so the two cannot drift.

mdk/engine/train.py builds the mapping; a part that is None in this run (no scaler, no EMA) is
neither saved nor loaded. The model's weights are not a part: the stage checkpointer loads them
first, as the model's structure must be prepared for them.
"""
from __future__ import annotations

import logging
import random
from typing import Any, Mapping

import numpy as np
import torch

from mdk import dist
from mdk.engine.loop import HookBase
from mdk.world import World

log = logging.getLogger(__name__)


class RunState:
    """Named stateful parts; ``state_dict`` / ``load_state_dict`` walk the same names."""

    def __init__(self, parts: Mapping[str, Any]) -> None:  # each with state_dict/load_state_dict
        self.parts = {k: v for k, v in parts.items() if v is not None}

    def state_dict(self) -> dict[str, Any]:
        """Every part's state (on every rank: some parts gather over the ranks)."""
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore every part; one the checkpoint lacks (switched on since) starts fresh."""
        for name, part in self.parts.items():
            if state.get(name) is not None:
                part.load_state_dict(state[name])


class ConfiguredOptimizer:
    """The optimizer as a part whose hyper-parameters stay this run's: loading restores its
    per-parameter state (momentum, moments) but, unlike torch's ``load_state_dict``, keeps this
    config's lr, weight decay, betas (docs/pipeline.md). The lr is the scheduler's, loaded after."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state)
        for group, keep in zip(self.optimizer.param_groups, mine, strict=True):
            group.update(keep)


class RankRNG:
    """Every rank's random generators, ``{rank: state}``: saving gathers them (a collective, so
    every rank saves), loading restores this rank's own."""

    def __init__(self, world: World) -> None:
        self.world = world

    def state_dict(self) -> dict[int, Any]:
        kind, key, *rest = np.random.get_state()
        # numpy's key as a list of ints: a checkpoint holds plain data only (read back with
        # torch's safe unpickler); set_state takes the list as it took the array
        s = {"python": random.getstate(), "numpy": (kind, key.tolist(), *rest),
             "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            s["cuda"] = torch.cuda.get_rng_state_all()
        return dict(enumerate(dist.all_gather_object(s)))

    def load_state_dict(self, state: dict[int, Any]) -> None:
        s = state.get(self.world.rank)
        if s is None:
            return
        random.setstate(s["python"])
        np.random.set_state(s["numpy"])
        torch.set_rng_state(s["torch"])
        if "cuda" in s and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(s["cuda"])


class HookStates:
    """The state of each hook that has one, by the hook's class name (detectron2's convention)."""

    def __init__(self, hooks: list[HookBase]) -> None:
        self.hooks = {type(h).__name__: h for h in hooks
                      if type(h).state_dict is not HookBase.state_dict}

    def state_dict(self) -> dict[str, Any]:
        return {name: h.state_dict() for name, h in self.hooks.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore each hook by its class name; a saved hook this run lacks is a warning."""
        unknown = sorted(set(state) - set(self.hooks))
        if unknown:
            log.warning("the checkpoint holds the state of hooks this run does not have: %s "
                        "(left unused)", ", ".join(unknown))
        for name, h in self.hooks.items():
            if name in state:
                h.load_state_dict(state[name])
