"""Weights into a freshly built model: a stage's own checkpoint in its structure (``load_into``,
``load_model_for``), and a stage's starting file, whatever wrote it (``load_start``: all of it
for the input of a stage that continues a chain, what fits for a float stage's starting point;
docs/pipeline.md, "Where a stage's weights come from" and "Start from weights").
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from mdk.checkpoint.files import CheckpointError, load_checkpoint, load_model_weights
from mdk.checkpoint.gti_mdk import STEPS as GTI_MODES
from mdk.checkpoint.meaning import check_input
from mdk.checkpoint.sources import Source, Want, weights_of
from mdk.checkpoint.transfer import load_all, transfer
from mdk.models.build import build_model
from mdk.paths import resolve_path
from mdk.quant.modes import drop_bn
from mdk.stage import apply_stage, stage_names, stage_spec
from mdk.stage_config import StageConf


def spec_of(ck: dict[str, Any]) -> Optional[StageConf]:
    """The record of the stage that wrote ``ck``; None for weights from elsewhere."""
    saved = ck.get("stage_spec")
    if isinstance(saved, dict):
        return StageConf.from_node(saved)
    name = ck.get("stage")
    return stage_spec(str(name)) if name in stage_names() else None


def load_into(model: torch.nn.Module, ck: dict[str, Any], path: Path, strict: bool = True,
              prefer_ema: bool = True) -> None:
    """Load ``ck``'s weights into a freshly built model, giving it the checkpoint's structure
    (BN folded) first. ``prefer_ema``: the EMA weights when there are (what chose best.pth)."""
    spec = spec_of(ck)
    if spec is not None and spec.folds_bn:
        drop_bn(model)
    load_model_weights(model, weights_of(ck, prefer_ema), path, strict=strict)


def load_model_for(cfg: DictConfig, path: Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval(), checkpoint): ``cfg``'s model with ``path`` loaded, in its stage's
    evaluation mode."""
    ck = load_checkpoint(path)
    model = build_model(cfg)
    load_into(model, ck, path)
    spec = spec_of(ck)
    if spec is None:
        raise CheckpointError(f"checkpoint {path} was not written by a stage declared here (its "
                              f"stage: {ck.get('stage')!r}); move it away (or restore it) and run "
                              "again")
    apply_stage(model, spec, str(cfg.chip), evaluate=True)
    return model.eval(), ck


def input_advice(spec: StageConf) -> str:
    """What to do about a stage's starting file that cannot be used."""
    if spec.init_weights:
        return (f"it is step.init_weights of {spec.name}: name another file, or drop the key to "
                f"start {spec.name} from " + (f"{spec.init_from}'s result" if spec.init_from
                                               else "random weights"))
    if spec.init_from is None:
        return (f"it is the pretrained starting point of {spec.name} ({spec.pretrained}/): put a "
                "file there that fits this model (an mdk or GTI MDK checkpoint, a torchvision VGG "
                f"file), or remove it to start {spec.name} from random weights")
    return (f"it is the input of {spec.name}: run `python run.py step={spec.init_from}` again to "
            "rebuild it, or restore it")


def transfers(spec: StageConf) -> bool:
    """A stage whose starting file comes from elsewhere takes what fits (a float starting point:
    no input stage); a stage that continues a chain takes all of its input."""
    return spec.init_from is None


def want_for(cfg: DictConfig, spec: StageConf) -> Want:
    """What ``spec`` needs of its starting file; a GTI file is assumed to hold what the stage's
    input stage would have written (its mode), unless its folder or the user says."""
    default = (1, "a float starting point")
    if spec.init_from is not None:
        mode = stage_spec(spec.init_from).quant
        step = next((k for k, m in GTI_MODES.items() if m == mode), 1)
        default = (step, f"what {spec.name} starts from: {spec.init_from}'s result")
    caps = resolve_path(spec.init_caps, os.getcwd()) if spec.init_caps else None
    return Want(caps=spec.quant.activations, gti_step=spec.init_gti_step, caps_file=caps,
                channels=spec.init_channels, gti_default=default, preset=str(cfg.model.name))


def load_start(model: torch.nn.Module, src: Source, cfg: DictConfig, spec: StageConf) -> str:
    """Load a stage's starting file into ``model`` (before the stage's mode is applied); the
    log line's body: what came over and what was assumed. An mdk checkpoint that is the input of
    a chain stage must mean what this run means (mdk/checkpoint/meaning.py)."""
    preset = str(cfg.model.name)
    if src.kind == "mdk":
        written_by = spec_of(src.ck)
        if written_by is not None and written_by.folds_bn:
            drop_bn(model)  # its convs hold the BN already
        if not transfers(spec):
            check_input(src.ck, src.path, cfg, spec)
    if src.kind == "vgg" and not transfers(spec):
        raise CheckpointError(f"{src.path} is a torchvision VGG file: a starting point for a "
                              f"float stage (step.init_weights of a stage without init_from), not "
                              f"the input of {spec.name}, which continues {spec.init_from}'s model")
    try:
        return transfer(model, src, preset) if transfers(spec) else load_all(model, src, preset)
    except CheckpointError as e:  # say which file of the run it is, and what to do
        raise CheckpointError(f"{e} ({input_advice(spec)})") from None
