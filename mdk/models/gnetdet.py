"""GNetDet: a plain stack of chip layers (docs/pipeline.md) with a YOLOv1-style output grid
(GNetDet-448 as published: conf/model/gnetdet.yaml); the head (mdk.models.heads) says what the
output channels mean.
"""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator, Optional, Sequence, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mdk.models.heads import YoloV1Head
from mdk.quant.activation import quantize_input
from mdk.quant.layers import ChipConv

LayerSpec = Sequence[Union[int, str]]
# trainer.activation_checkpointing: batch slices recomputed one at a time in backward
CHECKPOINT_SLICES = 4


class GNetDet(nn.Module):
    def __init__(self, num_classes: int, channels: LayerSpec, mask_bits: Sequence[int],
                 image_size: int = 448, boxes_per_cell: int = 2, batch_norm: bool = False,
                 head: Optional[Any] = None) -> None:
        super().__init__()
        # A plain attribute, not state (set by build_model): it changes memory, never the numbers.
        self.activation_checkpointing = False
        # Batch slices recomputed one at a time (1, whole batches: build_model, deterministic mode).
        self.checkpoint_slices = CHECKPOINT_SLICES
        self.head = head if head is not None else YoloV1Head(num_classes, boxes_per_cell)
        if self.head.num_classes != num_classes:
            raise ValueError(f"head.num_classes={self.head.num_classes} but the model predicts "
                             f"{num_classes} classes; leave head.num_classes at "
                             "${dataset.num_classes}")
        self.num_classes = num_classes
        self.boxes_per_cell = self.head.boxes_per_cell
        self.image_size = image_size
        out_ch = self.head.channels
        spec = list(channels)
        convs = [(int(c), spec[j + 1:j + 2] == ["M"]) for j, c in enumerate(spec) if c != "M"]
        if len(mask_bits) != len(convs) + 1:
            raise ValueError(f"model.net.mask_bits has {len(mask_bits)} entries but the model has "
                             f"{len(convs) + 1} conv layers (channels plus the output conv); "
                             "give one mask bit width per conv layer")
        ins = [3] + [c for c, _ in convs]
        layers = [ChipConv(ins[i], c, mask_bits[i], pool=pool, batch_norm=batch_norm)
                  for i, (c, pool) in enumerate(convs)]
        # The output conv is a chip layer too: 5-bit activation from step3 on, linear before.
        layers.append(ChipConv(ins[-1], out_ch, mask_bits[-1], pool=False, batch_norm=False,
                               relu=False))
        self.layers = nn.ModuleList(layers)
        n_pool = spec.count("M")
        if image_size % (2 ** n_pool):
            step = 2 ** n_pool
            lower = max(step, image_size // step * step)
            raise ValueError(f"model.image_size={image_size} must be divisible by 2^{n_pool} = "
                             f"{step} (the model has {n_pool} 2x2 max-pools): e.g. {lower} or "
                             f"{lower + step}")
        self.grid = image_size // (2 ** n_pool)
        # Step4 sets this to c_last / 31 after gain fusion so outputs keep their float scale.
        self.register_buffer("out_scale", torch.tensor(1.0))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(m.bias)
        # Output conv starts near zero: with Kaiming init every cell predicts O(1) confidences,
        # and the first epochs go into unlearning them.
        nn.init.normal_(self.layers[-1].conv.weight, std=0.01)
        bias = getattr(self.head, "output_bias", lambda: None)()
        if bias is not None:
            with torch.no_grad():
                self.layers[-1].conv.bias.copy_(bias)

    def chip_layers(self) -> list[ChipConv]:
        return list(self.layers)

    def segments(self) -> list[tuple[int, int]]:
        """Layer ranges ``[lo, hi)`` checkpointed as one unit: about sqrt(n) groups, the classic
        memory/recompute balance; only the group inputs are kept between forward and backward."""
        n = len(self.layers)
        size = max(1, math.ceil(n / max(1, round(math.sqrt(n)))))
        return [(lo, min(n, lo + size)) for lo in range(0, n, size)]

    def _run(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        for layer in self.layers[lo:hi]:
            x = layer(x)
        return x

    def _can_slice(self, lo: int, hi: int) -> bool:
        """True when layers [lo, hi) may run on batch slices with the same results up to float
        rounding: no training-mode BN (it couples the images) and no 5-bit activations (they
        turn a last-bit difference at a tie into a whole level)."""
        return not any((isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training)
                       or (isinstance(m, ChipConv) and m.quant_act)
                       for m in self.layers[lo:hi].modules())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images: [B, 3, H, W] uint8 (or float 0..255) -> [B, 5*boxes+C, grid, grid]."""
        x = quantize_input(images)
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():
            for lo, hi in self.segments():
                ctx = lambda lo=lo, hi=hi: (nullcontext(), self._frozen_bn(lo, hi))  # noqa: E731
                if self.checkpoint_slices > 1 and self._can_slice(lo, hi) and x.shape[0] > 1:
                    # Per slice: a layer's backward needs several full-batch-sized buffers at
                    # once, and that, not what is stored, sets the peak.
                    x = torch.cat([checkpoint(self._run, xc, lo, hi, use_reentrant=False,
                                              context_fn=ctx)
                                   for xc in x.chunk(self.checkpoint_slices)])
                else:
                    x = checkpoint(self._run, x, lo, hi, use_reentrant=False, context_fn=ctx)
        else:
            x = self._run(x, 0, len(self.layers))
        return x * self.out_scale

    @contextmanager
    def _frozen_bn(self, lo: int, hi: int) -> Iterator[None]:
        """The backward recompute must not update a training-mode BN's running stats twice: it runs
        on throw-away copies and the real buffers are put back."""
        saved = []
        for m in self.layers[lo:hi].modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                for name in ("running_mean", "running_var", "num_batches_tracked"):
                    buf = getattr(m, name)
                    if buf is not None:
                        saved.append((m, name, buf))
                        setattr(m, name, buf.clone())
        try:
            yield
        finally:
            for m, name, buf in saved:
                setattr(m, name, buf)
