"""A pipeline stage is one declared thing: its record in ``conf/step/<stage>.yaml`` (schema:
mdk/stage_config.py) says all mdk needs to know of it; the chain's order follows ``init_from``.
A new stage is one YAML (plus one function if its work is new); no Python file names a stage.

Records are read through Hydra, so a stage on ``hydra.searchpath`` is found like a built-in one.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from torch import nn

from mdk.compose import compose, group_options, running_app
from mdk.errors import ConfigError
from mdk.calibration_config import with_calibration_node
from mdk.quant.chips import check_export_size
from mdk.quant.modes import ModeReport, apply_mode
from mdk.stage_config import (StageConf, check_init, check_kind, check_schedule, check_stages,
                              running_stages)

log = logging.getLogger(__name__)


def stage_names() -> list[str]:
    return [n for n in group_options("step") if not n.startswith("_")]


@functools.lru_cache(maxsize=64)
def _record(name: str, searchpath: tuple[str, ...]) -> DictConfig:
    if name not in group_options("step"):
        raise ConfigError(f"step={name!r} is unknown; use one of {stage_names()}")
    # The step group alone (no primary config): the record is the same, and the whole root
    # config, composed once per stage of a pipeline, cost ~0.5 s each at every start.
    cfg = compose([f"+step={name}"], config_name=None)
    return OmegaConf.create(OmegaConf.to_container(cfg.step, resolve=False))


def stage_record(name: str) -> DictConfig:
    """The unresolved record of stage ``name`` (a copy: callers may merge into it)."""
    return _record(str(name), tuple(running_app()[0])).copy()


def stage_conf(name: str) -> StageConf:
    """The typed record of stage ``name`` (``StageConf``: its kind, mode, input, ...)."""
    return StageConf.from_node(stage_record(name))


def chain(name: str) -> list[str]:
    """The stages that lead to ``name`` (following ``init_from``), first stage first."""
    out = [name]
    src = stage_conf(name).init_from
    while src and src not in out:
        out.insert(0, src)
        src = stage_conf(src).init_from
    return out


def apply_stage(model: nn.Module, stage: str | StageConf, chip: str = "5801",
                evaluate: bool = False) -> ModeReport:
    """Switch the chip layers into ``stage``'s mode (its ``eval_quant`` mode with ``evaluate``)."""
    spec = stage if isinstance(stage, StageConf) else stage_conf(stage)
    return apply_mode(model, spec.eval_mode if evaluate else spec.quant, str(chip), spec.name)


def config_for_stage(cfg: DictConfig, stage: str, train_images: Optional[int] = None) -> DictConfig:
    """``cfg`` (not mutated) as stage ``stage`` runs it (docs/pipeline.md: its record, its
    ``stages.<stage>`` overrides, epochs and lr; ``train_images``, the train split's size, for
    ``min_iters``). Call it on the unresolved config so ``${trainer.epochs}`` follows the stage."""
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
        whole = _whole(new.step, extra)
        rest = {k: v for k, v in extra.items() if k not in whole}
        new = OmegaConf.merge(new, {"step": dict.fromkeys(whole)}, {"step": rest}, {"step": whole})
    check_kind(new.step.kind, stage)
    check_init(new.step, stage)
    new = with_calibration_node(new, stage)  # checked, in the one spelling the stage records
    epochs, scale = check_schedule(new.step, stage)
    least = min_epochs(cfg, new.step, train_images)
    if least is not None and least > (epochs or int(cfg.trainer.epochs)):
        log.info("%s: %d epochs of %d iterations, for step.min_iters=%d (instead of %d)", stage,
                 least, int(train_images) // int(cfg.trainer.batch_size), new.step.min_iters,
                 epochs or int(cfg.trainer.epochs))
        epochs = least
    if epochs is None and scale == 1.0:
        return new
    if new is cfg:
        new = OmegaConf.merge(cfg, {})  # a copy (keeps interpolations and the struct flag)
    if epochs is not None:
        new.trainer.epochs = epochs
    new.optim.lr = float(cfg.optim.lr) * scale
    return new


def _whole(record: DictConfig, extra: DictConfig) -> dict[str, Any]:
    """The nodes of ``extra`` that replace the record's instead of merging into it, as a group
    choice does: a word (an option's name) or a node of another ``_target_``; and a node in an
    older record's words (``calibration: {method: kl}``), over the record's values, for the
    stage's reader (mdk/calibration_config.py) to read."""
    out: dict[str, Any] = {}
    for k, v in extra.items():
        mine = record.get(k)
        if not OmegaConf.is_dict(mine):
            continue
        target = mine.get("_target_")
        if not OmegaConf.is_dict(v) or v.get("_target_", target) != target:
            out[k] = v
        elif "method" in v and "method" not in mine:
            out[k] = OmegaConf.merge(OmegaConf.to_container(mine), OmegaConf.to_container(v))
    return out


def min_epochs(cfg: DictConfig, stage_cfg: DictConfig, train_images: Optional[int]) -> Optional[int]:
    """The epochs a stage needs for its ``min_iters`` optimizer steps on ``train_images`` images
    (None: no minimum, count unknown, or a quick run: ``limit_train_batches`` set)."""
    least = stage_cfg.get("min_iters")
    if not least or not train_images or cfg.trainer.get("limit_train_batches"):
        return None
    per_epoch = int(train_images) // int(cfg.trainer.batch_size)
    return -(-int(least) // per_epoch) if per_epoch > 0 else None


def check_pipeline(cfg: DictConfig) -> None:
    """The ``step`` group's checks over the whole command, before any stage trains: the records
    exist, an exported model fits the chip, and ``dist.exact_chunk`` never trains live BatchNorm
    (each chunk would normalise with its own statistics)."""
    check_stages(cfg, stage_names())
    # each running stage's config checks its calibration node (with_calibration_node)
    specs = {s: StageConf.from_node(config_for_stage(cfg, s).step) for s in running_stages(cfg)}
    if any(spec.export for spec in specs.values()):
        check_export_size(cfg)
    chunk = cfg.dist.get("exact_chunk")
    if chunk is None or not cfg.model.net.get("batch_norm", False):
        return
    for s, spec in specs.items():
        if spec.trains and not spec.folds_bn:
            folded = spec.next
            while folded and not stage_conf(folded).folds_bn:
                folded = stage_conf(folded).next
            where = f"use exact_chunk from {folded} on (BN is folded there), or " if folded else ""
            raise ConfigError(
                f"dist.exact_chunk={chunk} cannot train {s} with BatchNorm "
                "(model.net.batch_norm=true): each chunk would normalise with its own statistics. "
                f"Add model.net.batch_norm=false, or {where}dist.exact_chunk=null")
