"""Numerics of a run on its device: determinism, TF32, mixed precision and memory layout, as
switches (``trainer.deterministic``, ``tf32``, ``amp``, ``amp_dtype``, ``channels_last``: their
table in docs/distributed.md, "On GPUs").

``trainer.amp=auto`` is on only for a float stage (no quantizer) trained on a CPU with native
bfloat16: oneDNN emulates it elsewhere, far slower than float32; bf16 cannot hold the fake-quant
grids (cap/31 steps) of quantized stages; on CUDA it stays off until fp16 accuracy is measured
there. Evaluation, calibration and export never run under autocast.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch
from omegaconf import DictConfig

log = logging.getLogger(__name__)

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def configure(trainer: DictConfig, device: torch.device) -> None:
    """Set this process's determinism and TF32 switches (before any CUDA kernel runs)."""
    deterministic = bool(trainer.get("deterministic", False))
    tf32 = bool(trainer.get("tf32", True)) and not deterministic
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = not deterministic
        torch.backends.cudnn.deterministic = deterministic
        if deterministic:
            # cuBLAS is deterministic only with a fixed workspace (read when cuBLAS starts).
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    if deterministic:
        log.info("trainer.deterministic=true: deterministic kernels, no cuDNN benchmark, no TF32")


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bfloat16 convolutions natively on this CPU (not emulated)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the query: assume emulation
        return False


def amp_enabled(trainer: DictConfig, device: torch.device, float_model: bool = False) -> bool:
    """``trainer.amp`` resolved (module docstring)."""
    value = trainer.get("amp", False)
    if value == "auto":
        return device.type == "cpu" and float_model and cpu_has_native_bf16()
    return bool(value)


def amp_dtype(trainer: DictConfig, device: torch.device,
              float_model: bool = False) -> Optional[torch.dtype]:
    """The autocast dtype of ``trainer.amp`` on ``device`` (None: full precision);
    ``float_model``: the stage trains without quantizers (``trainer.amp=auto`` needs to know)."""
    if not amp_enabled(trainer, device, float_model):
        return None
    name = str(trainer.get("amp_dtype", "auto"))
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return _DTYPES[name]


def channels_last(trainer: DictConfig, device: torch.device, float_model: bool = False) -> bool:
    """``trainer.channels_last`` resolved for ``device`` (module docstring)."""
    value = trainer.get("channels_last", False)
    if value == "auto":
        return device.type == "cpu" or amp_enabled(trainer, device, float_model)
    return bool(value)
