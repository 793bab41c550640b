"""Models from saved files for the tools and the quantization report: a stage checkpoint's own
model config, and an exported chip model behind the usual ``model(images)`` call."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from mdk.targets import build
from mdk.errors import ConfigError
from mdk.quant.chip_model import load_chip_model
from mdk.quant.export import ONNX_FILE
from mdk.quant.integer_ref import integer_forward

RUNTIMES = ("integer", "onnx")


class ToolError(ValueError):
    """A user error of a tool (bad path, file or override): printed as one line, exit status 1."""


def _overrides_key(overrides: Sequence[str], *keys: str) -> bool:
    names = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    return any(n == k or n.startswith(k + ".") for n in names for k in keys)


def with_checkpoint_model(cfg: DictConfig, ck: dict, overrides: Sequence[str]) -> DictConfig:
    """``cfg`` with the checkpoint's own model/chip config unless the user overrode them, and
    its head and loss (they read the model's output) unless the user named a head or loss."""
    saved = ck.get("config")
    if not isinstance(saved, dict) or _overrides_key(overrides, "model", "chip"):
        return cfg
    keys = ["model", "chip"]
    if not _overrides_key(overrides, "head", "loss"):
        keys += ["head", "loss"]
    patch = {k: saved[k] for k in keys if k in saved}
    # nodes replaced whole (another head's schema has other keys), plain values merged
    merged = OmegaConf.merge(cfg, {k: None for k in patch if OmegaConf.is_dict(cfg.get(k))})
    return OmegaConf.merge(merged, patch)


def head_kind(node: Any) -> Optional[str]:
    """The ``kind`` of the head a config node builds (its conf/head/ option name), or None."""
    try:
        return getattr(build(node, "head"), "kind", None)
    except ConfigError:  # a head of a package this machine lacks: keep the command's
        return None


class ChipModelNet(nn.Module):
    """An exported chip model behind the usual ``model(images)`` call (CPU only): the integer
    reference (its float32 cast is exact: every output is a 5-bit level times ``out_scale``) or
    the exported ``model.onnx`` in onnxruntime."""

    def __init__(self, directory: Path, runtime: str = "integer") -> None:
        super().__init__()
        if runtime not in RUNTIMES:
            raise ToolError(f"--runtime {runtime!r}: use one of {RUNTIMES}")
        self.cm = load_chip_model(directory)
        self.session = None
        if runtime == "onnx":
            import onnxruntime as ort  # here: a heavy optional runtime, only for --runtime onnx

            onnx_path = Path(directory) / ONNX_FILE
            if not onnx_path.is_file():
                raise ToolError(f"{onnx_path} is missing: export again with step=step4, or use "
                                "--runtime integer")
            try:
                self.session = ort.InferenceSession(str(onnx_path),
                                                    providers=["CPUExecutionProvider"])
            except Exception as e:  # onnxruntime raises its own Fail/InvalidProtobuf types
                raise ToolError(f"{onnx_path} cannot be loaded by onnxruntime ({e}); export again "
                                "with step=step4") from None

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.session is not None:
            u8 = images if images.dtype == torch.uint8 else images.clamp(0, 255).to(torch.uint8)
            out = self.session.run(None, {"image_u8": u8.cpu().numpy()})[0]
            return torch.from_numpy(out).float()
        return integer_forward(self.cm, images.cpu(), keep=False)[0].float()
