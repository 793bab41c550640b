"""Draw a model's detections on an image and save a PNG.

    python -m mdk.tools.demo outputs/checkpoints/gnetdet_small_shapes/step1/best.pth \\
        --image photo.jpg --out detections.png
    python -m mdk.tools.demo .../step4/chip_model --runtime onnx --image photo.jpg --out out.png

The model is loaded exactly as by ``mdk.tools.evaluate``; class names come from
``dataset.class_names`` (docs/pipeline.md, "Tools").
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F
from torchvision.utils import draw_bounding_boxes

from mdk.models.build import build_head
from mdk.checkpoint.sources import Want
from mdk.errors import ToolError
from mdk.tools.evaluate import add_model_args, gti_args, load_any

MIN_DRAW_SIZE = 384  # enlarge smaller images so the default bitmap font is legible
PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6",
           "#bfef45", "#fabed4", "#469990", "#dcbeff", "#9a6324", "#800000", "#aaffc3",
           "#808000", "#000075", "#a9a9a9", "#ffe119", "#ffd8b1", "#000000"]


def read_image(path: Path) -> torch.Tensor:
    """RGB uint8 ``[3, H, W]`` with a clear error for a missing or undecodable file."""
    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB"))
    except FileNotFoundError:
        raise ToolError(f"--image {path} does not exist") from None
    except OSError as e:
        raise ToolError(f"--image {path} cannot be decoded as an image ({e})") from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


@torch.no_grad()
def detect(model: torch.nn.Module, image: torch.Tensor, image_size: int, head: Any,
           score_thresh: float, nms_iou: float, device: torch.device) -> dict[str, torch.Tensor]:
    """Detections on ``image`` (uint8 [3, H, W]) in its own pixel coordinates; ``head`` reads
    the model's output (mdk.models.heads)."""
    h, w = image.shape[1:]
    x = image if (h, w) == (image_size, image_size) else F.resize(
        image, [image_size, image_size], interpolation=F.InterpolationMode.BILINEAR, antialias=True)
    pred = model(x.unsqueeze(0).to(device)).cpu()
    det = head.decode(pred, image_size, score_thresh, nms_iou)[0]
    det["boxes"] = det["boxes"] * torch.tensor([w / image_size, h / image_size] * 2)
    return det


def draw(image: torch.Tensor, det: dict[str, torch.Tensor], class_names: Sequence[str]) -> torch.Tensor:
    """``image`` with labelled boxes (enlarged first if it is small)."""
    factor = max(1, -(-MIN_DRAW_SIZE // min(image.shape[1:])))
    if factor > 1:
        image = image.repeat_interleave(factor, 1).repeat_interleave(factor, 2)
    if len(det["boxes"]) == 0:
        return image
    names = [class_names[i] if 0 <= i < len(class_names) else f"class{i}"
             for i in det["labels"].tolist()]
    labels = [f"{n} {s:.2f}" for n, s in zip(names, det["scores"].tolist())]
    colors = [PALETTE[i % len(PALETTE)] for i in det["labels"].tolist()]
    return draw_bounding_boxes(image, det["boxes"] * factor, labels=labels, colors=colors,
                               width=2, label_background_colors=colors, label_colors="white",
                               fill_labels=True)


def run_demo(path: str | Path, image_path: str | Path, out: str | Path,
             overrides: Sequence[str] = (), runtime: str = "integer",
             score_thresh: float = 0.3, gti: Optional[Want] = None
             ) -> tuple[dict[str, torch.Tensor], str]:
    """Detect on ``image_path`` with the model at ``path`` and write the drawing to ``out``
    (``gti``: what the command line says of a GTI MDK checkpoint); (the detections, what the
    model is, as ``mdk.tools.evaluate`` says it)."""
    image = read_image(Path(image_path))
    loaded = load_any(path, overrides, runtime, gti)
    cfg = loaded.cfg
    det = detect(loaded.model, image, int(cfg.model.image_size), build_head(cfg),
                 score_thresh, float(cfg.trainer.nms_iou), loaded.device)
    drawn = draw(image, det, list(cfg.dataset.class_names))
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ToolError(f"--out {out}: the demo writes PNG files; use a .png name")
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(drawn.permute(1, 2, 0).numpy()).save(out)
    return det, loaded.description


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--image", required=True, help="input image (any format PIL reads)")
    ap.add_argument("--out", required=True, help="output PNG")
    ap.add_argument("--score-thresh", type=float, default=0.3,
                    help="draw detections scoring above this (box conf x class score)")
    args = ap.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        det, description = run_demo(args.path, args.image, args.out, args.overrides, args.runtime,
                       args.score_thresh, gti_args(args))
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(description)
    print(f"{len(det['boxes'])} detections above {args.score_thresh} drawn to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
