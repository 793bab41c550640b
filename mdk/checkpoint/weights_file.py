"""The one way from a weights file to a model, for every caller: a stage's start (its input, its
starting point, its own checkpoint on resume: mdk/checkpoint/layout.py and the preflight), the
export, ``mdk.tools.evaluate`` and ``demo``, ``to_gti``, ``ckpt_diff`` and the quantization
report.

``read_weights`` reads a file once, with torch's safe unpickler (mdk/checkpoint/files.py: no code
runs), and says what kind of file it is (an mdk checkpoint, a bare mdk ``state_dict``, a GTI MDK
checkpoint, a torchvision VGG file) and what it holds (the stage that wrote it, the classes and
boxes per cell its output layer predicts). ``WeightsFile.load`` puts it into a model (its tensors
in mdk's names: mdk/checkpoint/sources.py; what fits: mdk/checkpoint/transfer.py) and says what
came over and what was assumed. ``load_start`` adds a stage's rules (docs/pipeline.md, "Where a
stage's weights come from"), ``evaluation_model`` a tool's: the file in the mode it was written in.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from mdk.checkpoint import gti_mdk, vgg
from mdk.checkpoint.files import check_finite, load_model_weights, read_pth
from mdk.checkpoint.meaning import check_input
from mdk.checkpoint.sources import (KINDS, Source, Want, chip_layer_count, mdk_output, to_source,
                                    weights_of)
from mdk.checkpoint.transfer import load_all, transfer
from mdk.errors import CheckpointError
from mdk.models.build import build_model
from mdk.paths import resolve_path
from mdk.quant.modes import apply_mode, drop_bn
from mdk.stage import apply_stage, stage_conf, stage_names
from mdk.stage_config import StageConf

ADVICE = "move it away (or restore it) and run again"
# How a file goes into a model (``WeightsFile.load``)
OWN = "own"            # a stage's own checkpoint (a resume): its weights in its structure
AS_WRITTEN = "as written"  # a file a tool evaluates: mdk's in its structure, a GTI file whole
ALL = "all"            # the input of a stage that continues a chain: every tensor
WHAT_FITS = "what fits"  # a float stage's starting point from elsewhere: what fits


def written_by(ck: dict[str, Any]) -> Optional[StageConf]:
    """The record of the stage that wrote the mdk checkpoint ``ck``; None for weights from
    elsewhere. (``stage_spec`` is the files' name for the record.)"""
    saved = ck.get("stage_spec")
    if isinstance(saved, dict):
        return StageConf.from_node(saved)
    name = ck.get("stage")
    return stage_conf(str(name)) if name in stage_names() else None


def _kind(obj: Any) -> Optional[str]:
    """Which of ``KINDS`` a file's object is, by its keys; None: none."""
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        return "mdk"
    if gti_mdk.is_gti(obj):
        return "gti"
    if vgg.is_vgg(obj):
        return "vgg"
    if isinstance(obj, dict) and obj and all(torch.is_tensor(v) for v in obj.values()) and \
            chip_layer_count(obj):
        return "weights"
    return None


@dataclass
class WeightsFile:
    """A weights file as read: what wrote it (``kind``), what it holds (``content``: the object
    torch's safe unpickler gave), and what to do about it if it cannot be used (``advice``)."""
    path: Path
    kind: str
    content: Any
    advice: str = ADVICE

    @property
    def what(self) -> str:
        return KINDS[self.kind]

    @functools.cached_property
    def stage(self) -> Optional[StageConf]:
        """The stage that wrote it (an mdk checkpoint of a stage declared here), else None."""
        return written_by(self.content) if self.kind == "mdk" else None

    def describe(self) -> str:
        """What it is and holds, in words: ``an mdk checkpoint of stage step3 (3 classes, 2 boxes
        per cell)``, ``a GTI MDK checkpoint (16 conv layers, 20 classes)``."""
        if self.kind == "mdk":
            classes, boxes = mdk_output(self.content)
            of = f" of stage {self.content['stage']}" if self.content.get("stage") else ""
            parts = [f"{classes} classes" if classes else "", f"{boxes} boxes per cell" if boxes
                     else ""]
        elif self.kind == "gti":
            f = gti_mdk.parse(self.content, self.path)
            convs, of = len(f.convs), ""
            last = f.convs[convs - 1]["weight"].shape[0] - 5 * gti_mdk.BOXES
            parts = [f"{convs} conv layers", f"{last} classes"]
        else:
            layers = sum(1 for k, v in self.content.items() if k.endswith("weight") and v.dim() == 4)
            of, parts = "", [f"{layers} conv layers"]
        held = ", ".join(p for p in parts if p)
        return f"{self.what}{of}" + (f" ({held})" if held else "")

    def refusal(self, advice: str) -> CheckpointError:
        """The one line for a tool or stage that needs an mdk stage checkpoint and got this."""
        return CheckpointError(f"{self.path} is {self.describe()}, not a checkpoint of an mdk "
                               f"stage; {advice}")

    def stage_checkpoint(self, advice: str) -> dict[str, Any]:
        """The mdk checkpoint; ``refusal`` for any other file."""
        if self.kind != "mdk":
            raise self.refusal(advice)
        return self.content

    def source(self, model: torch.nn.Module, want: Optional[Want] = None,
               prefer_ema: bool = True) -> Source:
        """Its tensors in ``model``'s names (mdk/checkpoint/sources.py), checked finite."""
        return to_source(self.kind, self.content, self.path, model, want or Want(), self.advice,
                         prefer_ema)

    def load(self, model: torch.nn.Module, how: str, want: Optional[Want] = None,
             prefer_ema: bool = True, src: Optional[Source] = None) -> str:
        """Load it into ``model`` (freshly built, not yet in a stage's mode) as ``how`` says
        (``src``: its tensors, when the caller has them already); the log line's body: what
        came over and what was assumed. An mdk checkpoint gets the structure of the stage that
        wrote it first (BN dropped where its convs hold it)."""
        want = want or Want()
        if src is None and how == OWN:  # read and checked by files.load_checkpoint
            src = Source(self.path, "mdk", dict(weights_of(self.content, prefer_ema)), self.content)
        src = src or self.source(model, want, prefer_ema)
        if self.stage is not None and self.stage.folds_bn:
            drop_bn(model)  # its convs hold the BN already
        if self.kind == "mdk" and how in (OWN, AS_WRITTEN):
            load_model_weights(model, src.state, self.path, strict=True)
            return ""
        if how == WHAT_FITS:
            return transfer(model, src, want.preset)
        return load_all(model, src, want.preset)


def read_weights(path: Path, advice: str = ADVICE) -> WeightsFile:
    """The file at ``path``, read once (torch's safe unpickler); CheckpointError (one line) for a
    file that is missing, damaged, would run code, or is none of the kinds mdk reads."""
    path = Path(path)
    obj = read_pth(path, advice)
    kind = _kind(obj)
    if kind is None:
        what = (f"a state_dict of {len(obj)} tensors named like {list(obj)[:2]}"
                if isinstance(obj, dict) and obj else f"a {type(obj).__name__}")
        raise CheckpointError(
            f"checkpoint {path} is none of the files mdk starts from ({what}): an mdk checkpoint, "
            "an mdk state_dict (layers.{i}...), a GTI MDK checkpoint (features.conv{i}...) or a "
            f"torchvision VGG file; {advice}")
    if kind == "mdk":
        check_finite(obj["model"], path, advice)
    return WeightsFile(path, kind, obj, advice)


def of_checkpoint(path: Path, ck: dict[str, Any]) -> WeightsFile:
    """A stage's own checkpoint already read (files.load_checkpoint, a resume) as a WeightsFile."""
    return WeightsFile(Path(path), "mdk", ck)


# --- a stage's starting file -----------------------------------------------------------------
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


def want_for(cfg: DictConfig, spec: StageConf) -> Want:
    """What ``spec`` needs of its starting file; a GTI file is assumed to hold what the stage's
    input stage would have written (its mode), unless its folder or the user says."""
    default = (1, "a float starting point")
    if spec.init_from is not None:
        mode = stage_conf(spec.init_from).quant
        step = next((k for k, m in gti_mdk.STEPS.items() if m == mode), 1)
        default = (step, f"what {spec.name} starts from: {spec.init_from}'s result")
    caps = resolve_path(spec.init_caps, os.getcwd()) if spec.init_caps else None
    return Want(caps=spec.quant.activations, gti_step=spec.init_gti_step, caps_file=caps,
                channels=spec.init_channels, gti_default=default, preset=str(cfg.model.name))


def load_start(model: torch.nn.Module, f: WeightsFile, cfg: DictConfig, spec: StageConf) -> str:
    """Load a stage's starting file into ``model`` (before the stage's mode is applied): what
    fits for a float stage's starting point from elsewhere (no input stage), all of it for the
    input of a stage that continues a chain, which must mean what this run means
    (mdk/checkpoint/meaning.py). The log line's body: what came over and what was assumed."""
    want = want_for(cfg, spec)
    src = f.source(model, want)
    how = WHAT_FITS if spec.init_from is None else ALL
    if how == ALL and f.kind == "mdk":
        check_input(f.content, f.path, cfg, spec)
    if how == ALL and f.kind == "vgg":
        raise CheckpointError(f"{f.path} is a torchvision VGG file: a starting point for a "
                              f"float stage (step.init_weights of a stage without init_from), not "
                              f"the input of {spec.name}, which continues {spec.init_from}'s model")
    try:
        return f.load(model, how, want, src=src)
    except CheckpointError as e:  # say which file of the run it is, and what to do
        raise CheckpointError(f"{e} ({input_advice(spec)})") from None


# --- a file a tool evaluates -------------------------------------------------------------------
NO_STAGE = ("start a stage from it with step.init_weights=PATH and evaluate that stage's "
            "checkpoint")


def evaluation_model(f: WeightsFile, cfg: DictConfig, want: Optional[Want] = None
                     ) -> tuple[torch.nn.Module, str, str]:
    """(model in eval(), what was assumed, the mode's name): ``cfg``'s model with ``f`` loaded,
    in the mode it was written in: a stage checkpoint in its stage's evaluation mode, a GTI MDK
    checkpoint in its GTI step's (``want``: the user's word on it); ``refusal`` for the rest."""
    if f.kind not in ("mdk", "gti"):
        raise f.refusal(NO_STAGE)
    model = build_model(cfg)
    if f.kind == "gti":
        want = replace(want or Want(), as_written=True, preset=str(cfg.model.name))
        src = f.source(model, want)
        said = f.load(model, AS_WRITTEN, want, src=src)
        apply_mode(model, gti_mdk.STEPS[src.mode_step], str(cfg.chip), f"GTI step {src.mode_step}")
        return model.eval(), said, f"gti_step{src.mode_step}"
    f.load(model, AS_WRITTEN)
    if f.stage is None:
        raise CheckpointError(f"checkpoint {f.path} was not written by a stage declared here (its "
                              f"stage: {f.content.get('stage')!r}); move it away (or restore it) "
                              "and run again")
    apply_stage(model, f.stage, str(cfg.chip), evaluate=True)
    return model.eval(), "", f.stage.name
