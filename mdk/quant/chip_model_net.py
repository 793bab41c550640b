"""An exported chip model (mdk/quant/chip_model.py) behind the usual ``model(images)`` call, for the
tools and the quantization report: the integer reference or the exported ``model.onnx``."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from mdk.errors import ToolError
from mdk.quant.chip_model import load_chip_model
from mdk.quant.export import ONNX_FILE
from mdk.quant.integer_ref import integer_forward

RUNTIMES = ("integer", "onnx")


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
