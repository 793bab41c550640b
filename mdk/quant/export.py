"""Export a fused step4 model: the chip model directory (mdk.quant.chip_model), ONNX, and for
chip 5801 the GTI SDK hand-off in ``gti/`` (mdk.quant.gti_sdk); the files: docs/pipeline.md.

The ONNX graph is built from the exported integer mantissas, not from the training module, so it
is what the chip computes, in float ops onnxruntime runs.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mdk.errors import ConfigError
from mdk.quant.bn_fold import chip_layers
from mdk.quant.chip_model import ChipModel, chip_model_from, save_chip_model
from mdk.quant.chips import chip_takes, size_refusal
from mdk.quant.gti_sdk import GTI_CHIPS, write_gti_files

log = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
GTI_DIR = "gti"
OPSET = 17


class ChipOnnxNet(nn.Module):
    """Float-op rendering of a ChipModel (input uint8 NCHW, output the detector grid)."""

    def __init__(self, cm: ChipModel) -> None:
        super().__init__()
        self.pools = [L.pool for L in cm.layers]
        for i, L in enumerate(cm.layers):
            scale = float(2 ** L.shift)
            self.register_buffer(f"w{i}", L.weight.to(torch.float64).div(scale).float())
            self.register_buffer(f"b{i}", L.bias.to(torch.float64).div(scale).float())
        self.out_scale = float(cm.out_scale)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(torch.float32)
        x = torch.floor((torch.floor(x / 4) + 1) / 2).clamp(0, 31)
        for i, pool in enumerate(self.pools):
            x = F.conv2d(x, getattr(self, f"w{i}"), getattr(self, f"b{i}"), padding=1)
            x = x.clamp(0, 31)
            f = torch.floor(x)
            x = f + (x - f >= 0.5).to(x.dtype)
            if pool:
                x = F.max_pool2d(x, 2)
        return x * self.out_scale


def export_onnx(cm: ChipModel, path: Path) -> None:
    """Write ``cm`` as ONNX (opset 17, dynamic batch) with the legacy TorchScript exporter (the
    torch.export one needs ``onnxscript``, not a dependency)."""
    size = int(cm.meta.get("image_size") or 64)
    dummy = torch.zeros(1, 3, size, size, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ChipOnnxNet(cm).eval(), (dummy,), str(path), input_names=["image_u8"],
                          output_names=["output"], opset_version=OPSET, dynamo=False,
                          dynamic_axes={"image_u8": {0: "batch"}, "output": {0: "batch"}})


def export_chip_model(model: nn.Module, out_dir: str | Path, chip: str, onnx: bool = True,
                      gti: bool = True, allow_any_size: bool = False) -> ChipModel:
    """Export a fused step4 model to ``out_dir`` (``gti``, chip 5801: the GTI files in ``gti/``).

    An input size the chip does not take is a ConfigError, or with ``allow_any_size`` a
    simulation-only chip model (no GTI hand-off)."""
    cm = chip_model_from(model, chip)
    size = cm.meta.get("image_size")
    if size is not None and not chip_takes(chip, size):
        if not allow_any_size:
            raise ConfigError(size_refusal(chip, size))
        cm.simulation_only = True
    out_dir = save_chip_model(cm, out_dir)
    if onnx:
        export_onnx(cm, out_dir / ONNX_FILE)
    if cm.simulation_only:
        log.warning("chip model in %s is simulation-only: chip %s does not take %dx%d inputs "
                    "(export.allow_any_size=true); no GTI SDK hand-off", out_dir, chip, size, size)
    elif gti and str(chip) in GTI_CHIPS:
        layers = [(layer.conv.weight, layer.conv.bias) for layer in chip_layers(model)]
        try:
            write_gti_files(cm, out_dir / GTI_DIR, float_layers=layers)
        except ValueError as e:  # a layout the GTI chip spec cannot take: the mdk export stands
            log.warning("no GTI SDK hand-off in %s: %s", out_dir / GTI_DIR, e)
    elif gti:
        log.info("no GTI SDK hand-off for chip %s (the GTI PyTorch MDK converts for %s only)",
                 chip, "/".join(GTI_CHIPS))
    log.info("chip model (%s, %d layers) exported to %s", chip, len(cm.layers), out_dir)
    return cm
