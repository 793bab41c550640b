"""Evaluate any stage's checkpoint, or the exported chip model, on a dataset split: mAP@0.5 and the
mean loss, the numbers of the stage table of ``python run.py pipeline=[...]``.

    python -m mdk.tools.evaluate outputs/checkpoints/gnetdet_small_shapes/step3/best.pth
    python -m mdk.tools.evaluate outputs/checkpoints/gnetdet_small_shapes/step4/chip_model --runtime onnx
    python -m mdk.tools.evaluate <path> --split train trainer.limit_val_batches=5 trainer.batch_size=32
    python -m mdk.tools.evaluate outputs/checkpoints/gnetdet_small_shapes/step1/best.pth --reports out/

A checkpoint runs in its stage's evaluation mode with the model config saved in it (unless
``model...``/``chip`` overrides are given); a GTI MDK checkpoint in its GTI step's mode, with the
preset the overrides name (``--gti-step``, ``--caps``, ``--channels``: docs/gti-compat.md,
"Checkpoints"); a chip model directory through the integer reference (bit-exact with step4) or
onnxruntime, on the CPU. Hydra overrides compose the real ``conf/``. Details: docs/pipeline.md,
"Tools".
"""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from mdk.checkpoint.meaning import with_checkpoint_model
from mdk.checkpoint.sources import Want
from mdk.checkpoint.weights_file import evaluation_model, read_weights
from mdk.compose import compose
from mdk.data.class_names import fill_class_names
from mdk.engine.build import build_data, build_loss
from mdk.engine.reports import EvalReporter
from mdk.errors import CheckpointError, ConfigError, ToolError
from mdk.eval.config import METRICS
from mdk.eval.distributed import evaluate
from mdk.models.build import head_kind
from mdk.quant.chip_model_net import RUNTIMES, ChipModelNet
from mdk.sinks.base import NullSink
from mdk.stage import stage_conf
from mdk.stage_config import CHANNEL_ORDERS, GTI_STEPS
from mdk.world import World, single_process


@dataclass
class Loaded:
    """What a tool needs to run a model: the module (eval mode) and how to describe it."""
    model: nn.Module
    cfg: DictConfig          # the config the data and thresholds come from
    device: torch.device
    description: str
    name: str = "model"      # what report files are named after: the stage, or chip_model


def tool_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The real ``conf/`` composed with ``overrides`` (mdk.compose), errors as ToolError."""
    try:
        cfg = compose(list(overrides))
    except ConfigError as e:
        raise ToolError(f"bad override in {list(overrides)}: {e}") from None
    fill_class_names(cfg)  # a class list left out is read from the data, as a run reads it
    return cfg


def load_checkpoint_model(path: Path, overrides: Sequence[str] = (),
                          gti: Optional[Want] = None) -> Loaded:
    """A stage checkpoint as a model in its stage's evaluation mode (the record's eval_quant),
    with the model config saved in it; a GTI MDK checkpoint in its GTI step's mode, in the
    preset ``overrides`` name (``gti``: what the user said of it). The config is composed once,
    the file read once, the model built once."""
    cfg = tool_config(overrides)
    f = read_weights(path, advice="pass a best.pth/last.pth written by `python run.py`, or a GTI "
                                  "MDK checkpoint with the model= of its structure")
    if f.kind == "mdk":
        cfg = with_checkpoint_model(cfg, f.content, overrides)
    model, said, name = evaluation_model(f, cfg, gti)
    device = single_process(cfg.trainer.device).device
    if f.kind != "mdk":
        return Loaded(model.to(device), cfg, device,
                      f"{path} is {f.describe()}, read as model={cfg.model.name}: {said}", name)
    if model.num_classes != int(cfg.dataset.num_classes):
        raise ToolError(f"checkpoint {path} predicts {model.num_classes} classes but "
                        f"dataset={cfg.dataset.name} has {cfg.dataset.num_classes}; choose the "
                        "dataset it was trained on (dataset=...)")
    return Loaded(model.to(device), cfg, device,
                  f"{path} is {f.describe()}, evaluated as {_mode_name(f.stage)}", name)


def _mode_name(spec: Any) -> str:
    """The stage whose mode a checkpoint is evaluated in: its own, or (cal) the next stage's."""
    if spec.eval_mode == spec.quant:
        return spec.name
    if spec.next and stage_conf(spec.next).quant == spec.eval_mode:
        return spec.next
    return str(spec.eval_mode)


def load_chip_model_net(directory: Path, overrides: Sequence[str] = (),
                        runtime: str = "integer") -> Loaded:
    """An exported chip model directory as a model; the geometry comes from its meta."""
    net = ChipModelNet(directory, runtime)
    meta = net.cm.meta
    head = meta.get("head")  # exported by an mdk that records its head
    kind = head_kind(head) if isinstance(head, dict) else None
    if kind and not any(o.split("=", 1)[0].lstrip("+~") == "head" for o in overrides):
        overrides = [*overrides, f"head={kind}"]  # its group also picks the head's loss
    cfg = tool_config(overrides)
    patch: dict[str, Any] = {}
    if "image_size" in meta:
        patch["image_size"] = int(meta["image_size"])
    if "boxes_per_cell" in meta:
        patch["net"] = {"boxes_per_cell": int(meta["boxes_per_cell"])}
    cfg = OmegaConf.merge(cfg, {"model": patch})
    if kind and kind == head_kind(cfg.head):  # the exported values (priors ...) over the YAML's
        cfg = OmegaConf.merge(cfg, {"head": {k: v for k, v in head.items()
                                             if k not in ("_target_", "num_classes",
                                                          "boxes_per_cell")}})
    n_cls = meta.get("num_classes")
    if n_cls is not None and int(n_cls) != int(cfg.dataset.num_classes):
        raise ToolError(f"chip model {directory} predicts {n_cls} classes but "
                        f"dataset={cfg.dataset.name} has {cfg.dataset.num_classes}; choose the "
                        "dataset it was trained on (dataset=...)")
    net.grid = int(meta.get("grid", 0)) or None
    return Loaded(net.eval(), cfg, torch.device("cpu"),
                  f"chip model {directory} ({net.cm.chip}, {len(net.cm.layers)} layers, "
                  f"{runtime} runtime)", "chip_model")


def load_any(path: str | Path, overrides: Sequence[str] = (), runtime: str = "integer",
             gti: Optional[Want] = None) -> Loaded:
    """A checkpoint file or an exported chip model directory, with a clear error otherwise."""
    p = Path(path).expanduser()
    try:
        if p.is_dir():
            return load_chip_model_net(p, overrides, runtime)
        if not p.exists():
            raise ToolError(f"{p} does not exist: pass a stage checkpoint (<paths.checkpoints>/"
                            "<stage>/best.pth) or an exported chip model directory (.../step4/"
                            "chip_model)")
        return load_checkpoint_model(p, overrides, gti)
    except (CheckpointError, FileNotFoundError) as e:
        raise ToolError(str(e)) from None
    except (ValueError, KeyError) as e:  # malformed chip_model.json, mismatching weights, ...
        if isinstance(e, ToolError):
            raise
        raise ToolError(f"{p}: {e}") from None


def build_split(cfg: DictConfig, model: nn.Module, split: Optional[str] = None) -> Any:
    """The evaluation dataset: ``split`` (a split name of the dataset's reader, e.g. an
    ImageSets/Main list for VOC) or ``dataset.val_split``."""
    # One pass reads each image once anyway: a cache would only cost its memory.
    patch: dict[str, Any] = {"cache_images": False}
    if split:
        patch["val_split"] = split
    grid = getattr(model, "grid", None) or int(cfg.model.image_size) // 2 ** sum(
        1 for c in cfg.model.net.channels if c == "M")
    cfg = OmegaConf.merge(cfg, {"dataset": patch})
    _, val = build_data(cfg, grid, World(), train=False)
    return val


def evaluate_path(path: str | Path, overrides: Sequence[str] = (), runtime: str = "integer",
                  split: Optional[str] = None, reports: Optional[str | Path] = None,
                  gti: Optional[Want] = None) -> dict[str, Any]:
    """mAP@0.5 and mean loss of a checkpoint / chip model on a split (single process);
    ``reports``: a folder for its PR curves and detection grid (``res["reports"]``: the files)."""
    loaded = load_any(path, overrides, runtime, gti)
    cfg = loaded.cfg
    ds = build_split(cfg, loaded.model, split)
    loss_fn = build_loss(cfg)
    reporter = EvalReporter(Path(reports), loaded.name, ds, NullSink(),
                            int(cfg.eval.grid_images)) if reports else None
    res = evaluate(loaded.model, ds, int(cfg.trainer.batch_size), loaded.device,
                   cfg.trainer.conf_thresh, cfg.trainer.nms_iou, cfg.trainer.limit_val_batches,
                   loss_fn=loss_fn, progress=cfg.trainer.progress,
                   metric=str(cfg.eval.metric), box_rule=str(cfg.eval.box_rule),
                   keep=reporter.keep if reporter else None)
    res.update(description=loaded.description, split=ds.split, dataset=str(cfg.dataset.name))
    if reporter is not None:
        reporter.after_eval(0, best=True)
        res["reports"] = reporter.write_best(0)
    return res


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The arguments every tool that loads ``load_any``'s inputs takes (evaluate, demo)."""
    ap.add_argument("path", help="a stage checkpoint (.pth) or an exported chip_model directory")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. dataset=voc trainer.batch_size=32")
    ap.add_argument("--runtime", choices=RUNTIMES, default="integer",
                    help="how a chip model runs: integer reference (exact) or onnxruntime")
    ap.add_argument("--gti-step", type=int, choices=GTI_STEPS, default=None,
                    help="a GTI MDK checkpoint: the GTI step that wrote it (default: its folder "
                         "checkpoint/step<N>/, else 1, float)")
    ap.add_argument("--caps", default=None, metavar="RELU_CAP_TXT",
                    help="a GTI MDK checkpoint: its relu_cap.txt (default: beside it, or <GTI "
                         "root>/model/relu_cap.txt)")
    ap.add_argument("--channels", choices=CHANNEL_ORDERS, default=None,
                    help="a GTI MDK checkpoint: its image_format (default BGR, the GTI MDK's)")


def gti_args(args: argparse.Namespace) -> Want:
    """What the command line says of a GTI MDK checkpoint (the fields of Want it sets)."""
    return Want(gti_step=args.gti_step, caps_file=args.caps, channels=args.channels,
                gti_default=(1, "neither --gti-step nor its folder says; float assumed"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--split", default=None, help="dataset split (default: dataset.val_split)")
    ap.add_argument("--metric", choices=METRICS, default=None,
                    help="eval.metric: VOC07 11-point (default), VOC12 area, or COCO rules")
    ap.add_argument("--reports", default=None, metavar="DIR",
                    help="also write the PR curves and a grid of detections as PNGs into DIR")
    args = ap.parse_intermixed_args(argv)
    if args.metric:
        args.overrides = [*args.overrides, f"eval.metric={args.metric}"]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        res = evaluate_path(args.path, args.overrides, args.runtime, args.split, args.reports,
                            gti_args(args))
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{res['description']}")
    print(f"dataset {res['dataset']} split {res['split']!r}: {res['images']} images")
    print(f"mAP@0.5 {res['map50']:.4f}  loss {res['loss']:.4f}  ({res['metric']})")
    if "map_coco" in res:
        print(f"COCO mAP@[.5:.95] {res['map_coco']:.4f}")
    for p in res.get("reports", []):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
