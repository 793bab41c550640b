"""A pipeline stage is one declared thing: its record in ``conf/step/<stage>.yaml``.

The record says everything any part of mdk needs to know about a stage (schema:
``mdk.schema.StageConf``): where its weights come from (``init_from``, ``init_required``), which
stage comes next (``next``), the kind of work (``train`` / ``calibrate`` / ``export``, or ``work``:
a function for a new kind), the chip layers' mode while it runs (``quant``) and when its checkpoint
is evaluated (``eval_quant``; null = ``quant``), and its schedule (``epochs``, ``lr_scale``). The
order of the chain follows from ``init_from``. A new stage is one YAML (plus, if its work is
new, one function); nothing in the engine lists stage names.

Records are read through Hydra (``mdk.compose``), so a stage defined in another config directory
on the search path (``hydra.searchpath``) is found like a built-in one.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from omegaconf import DictConfig, OmegaConf
from torch import nn

from mdk.errors import ConfigError
from mdk.quant.modes import ModeReport, QuantMode, apply_mode, drop_bn

PRETRAINED = "step0"  # not a stage: the folder of pretrained weights step1 may start from


@dataclass(frozen=True)
class StageSpec:
    name: str
    init_from: Optional[str]
    init_required: bool
    next: Optional[str]
    train: bool
    calibrate: bool
    export: bool
    work: Optional[str]
    quant: QuantMode
    eval_quant: QuantMode
    epochs: Optional[int]
    lr_scale: float

    @classmethod
    def from_node(cls, node: Mapping[str, Any] | DictConfig) -> "StageSpec":
        d = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        quant = QuantMode.from_mapping(d.get("quant") or {})
        ev = d.get("eval_quant")
        return cls(name=str(d["name"]), init_from=d.get("init_from"),
                   init_required=bool(d.get("init_required", False)), next=d.get("next"),
                   train=bool(d.get("train", False)), calibrate=bool(d.get("calibrate", False)),
                   export=bool(d.get("export", False)), work=d.get("work"), quant=quant,
                   eval_quant=QuantMode.from_mapping(ev) if ev else quant,
                   epochs=d.get("epochs"), lr_scale=float(d.get("lr_scale", 1.0)))

    @property
    def kind(self) -> str:
        """What the stage does: a custom ``work`` function, ``calibrate``, ``train`` or ``none``."""
        return self.work or ("calibrate" if self.calibrate else "train" if self.train else "none")

    @property
    def folds_bn(self) -> bool:
        """Its checkpoints hold BN-folded weights (the model structure from this stage on)."""
        return self.quant.fold_bn


def stage_names() -> list[str]:
    """Every declared stage (the options of the ``step`` config group)."""
    from mdk.compose import group_options

    return [n for n in group_options("step") if not n.startswith("_")]


@functools.lru_cache(maxsize=64)
def _record(name: str, searchpath: tuple[str, ...]) -> DictConfig:
    from mdk.compose import compose, group_options

    if name not in group_options("step"):
        raise ConfigError(f"step={name!r} is unknown; use one of {stage_names()}")
    cfg = compose([f"step={name}"])
    return OmegaConf.create(OmegaConf.to_container(cfg.step, resolve=False))


def stage_record(name: str) -> DictConfig:
    """The unresolved record of stage ``name`` (a copy: callers may merge into it)."""
    from mdk.compose import _app

    return _record(str(name), tuple(_app()[0])).copy()


def stage_spec(name: str) -> StageSpec:
    return StageSpec.from_node(stage_record(name))


def chain(name: str) -> list[str]:
    """The stages that lead to ``name`` (following ``init_from``), first stage first."""
    out = [name]
    src = stage_spec(name).init_from
    while src and src != PRETRAINED and src not in out:
        out.insert(0, src)
        src = stage_spec(src).init_from
    return out


def apply_stage(model: nn.Module, stage: str | StageSpec, chip: str = "5801",
                evaluate: bool = False) -> ModeReport:
    """Switch the chip layers into ``stage``'s mode (its ``eval_quant`` mode with ``evaluate``)."""
    spec = stage if isinstance(stage, StageSpec) else stage_spec(stage)
    return apply_mode(model, spec.eval_quant if evaluate else spec.quant, str(chip), spec.name)


def prepare_structure(model: nn.Module, ckpt_stage: str) -> None:
    """Give a freshly built model the structure of a ``ckpt_stage`` checkpoint (BN folded from
    the first stage whose mode folds it) before its weights are loaded."""
    if ckpt_stage != PRETRAINED and stage_spec(ckpt_stage).folds_bn:
        drop_bn(model)


def stage_config(cfg: DictConfig, stage: str) -> DictConfig:
    """The config ``stage`` runs with: ``cfg`` with its ``step`` node replaced by the stage's
    record (``cfg`` itself is not mutated).

    ``step.*`` overrides reach only the stage named by ``step``; ``stages.<stage>`` (e.g.
    ``+stages.step3.epochs=12``) is merged into that stage's record. The stage's own ``epochs``
    (when not null) replaces ``trainer.epochs`` and ``lr_scale`` multiplies ``optim.lr``: the
    fine-tuning stages after step1 are short and need their own length. Call it on the
    unresolved config so ``${trainer.epochs}`` (e.g. the cosine T_max) follows the stage."""
    from mdk.config import stage_schedule

    if cfg.step.name == stage:
        new = cfg
    else:
        new = OmegaConf.merge(cfg, {"step": None})
        new.step = stage_record(stage)
    extra = (cfg.get("stages") or {}).get(stage)
    if extra:  # +stages.<stage>.<key>=value from the command line
        unknown = sorted(set(extra) - set(new.step))
        if unknown:
            raise ConfigError(f"stages.{stage}.{unknown[0]} is not a key of conf/step/{stage}.yaml; "
                              f"use one of {sorted(k for k in new.step if k != 'name')}")
        if "name" in extra and extra.name != stage:
            raise ConfigError(f"stages.{stage}.name={extra.name} cannot rename the stage")
        new = OmegaConf.merge(new, {"step": extra})
    epochs, scale = stage_schedule(new.step, stage)
    if epochs is None and scale == 1.0:
        return new
    if new is cfg:
        new = OmegaConf.merge(cfg, {})  # a copy (keeps interpolations and the struct flag)
    if epochs is not None:
        new.trainer.epochs = epochs
    new.optim.lr = float(cfg.optim.lr) * scale
    return new
