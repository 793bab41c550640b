"""Numerics of a run on its device: determinism, TF32 and mixed precision, as switches.

``trainer.deterministic`` (default false: it costs speed) makes a CUDA run repeat itself bit for
bit with the same seed: cuDNN picks deterministic kernels and never benchmarks (benchmarking
may pick another kernel per run), torch uses deterministic algorithms where it has them (warning,
not failing, for the few ops without one: kthvalue in calibration gives the same value either
way), cuBLAS gets a fixed workspace, and TF32 is off (its rounding depends on the kernel). On
the CPU runs are already deterministic for a fixed thread count (``dist.cpu_threads``).

``trainer.tf32`` (default true) lets float32 convolutions and matmuls use TF32 tensor cores on
Ampere and later GPUs (about 10 bits of mantissa in the products, float32 accumulation): the
fast default for training; off for float32-exact comparisons.

``trainer.amp`` (true | false | auto) with ``trainer.amp_dtype``: ``auto`` is float16 on CUDA
(with a GradScaler against gradient underflow; its state is saved and resumed) and bfloat16 on
the CPU (no scaler needed: bf16 has float32's exponent range); ``float16`` / ``bfloat16`` force
one. ``trainer.amp=auto`` (the default) is on for the CPU training of a float stage (step1: no
quantizer in the model) on a CPU with native bfloat16 arithmetic (AVX512-BF16 or AMX, as oneDNN
reports it), where bf16 autocast trains the default run 1.84x faster per epoch (20.6 -> 11.2 s,
benchmarks/README.md); off on a CPU without it (AVX2 only), where oneDNN emulates bf16 and the
same step is ~7x slower than float32 (3.0 vs 0.43 s per batch of 16 on a 2-core AVX2 EPYC); off
in quantized stages, whose fake-quant grids (cap/31 steps) bf16 cannot hold, and off on CUDA,
where float32 with TF32 stays the default until fp16 accuracy is measured there. Evaluation,
calibration and export never run under autocast.

``trainer.channels_last`` (memory layout of the training step, NHWC): ``auto`` is on on the CPU
(oneDNN's convolutions run natively in NHWC: +38 % train img/s for the default run on a 2-core
AMD EPYC, benchmarks/bench_gpu.py --device cpu) and, on CUDA, on with AMP (tensor cores;
bf16 1245 -> 1805 img/s on an H100) and off in float32, where it was not measured faster.
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
    """``trainer.amp`` resolved: ``auto`` is on for a float model trained on a CPU with native
    bfloat16 (see above)."""
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
    """``trainer.channels_last`` (true | false | auto) resolved for ``device``; see above."""
    value = trainer.get("channels_last", False)
    if value == "auto":
        return device.type == "cpu" or amp_enabled(trainer, device, float_model)
    return bool(value)
