"""BatchNorm over the global batch for any backend, gloo on CPU included (``dist.sync_bn=true``;
docs/distributed.md, "BatchNorm and dist.sync_bn"). The variance sums squared deviations from the
global mean (E[x^2]-E[x]^2 cancels badly in float32); the backward all-reduces the ``dy`` sums, so
each rank's input gradient holds every rank's contribution and DDP's averaging then scales as
SyncBatchNorm. In eval mode, or without a process group, it is ordinary BatchNorm2d.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as tdist
from torch import nn

_DIMS = (0, 2, 3)  # every dimension but the channel one of an NCHW tensor


def _per_channel(t: torch.Tensor) -> torch.Tensor:
    return t[None, :, None, None]


class _GlobalBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], running_mean: Optional[torch.Tensor],
                running_var: Optional[torch.Tensor], eps: float, momentum: float) -> torch.Tensor:
        c = x.shape[1]
        head = torch.cat([x.sum(_DIMS), x.new_tensor([x.numel() // c])])
        tdist.all_reduce(head)
        n = head[c]
        mean = head[:c] / n
        xmu = x - _per_channel(mean)
        sq = (xmu * xmu).sum(_DIMS)
        tdist.all_reduce(sq)
        var = sq / n
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():  # as nn.BatchNorm2d: the running variance is the unbiased one
                running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
                running_var.mul_(1 - momentum).add_(var * (n / (n - 1).clamp_min(1)), alpha=momentum)
        xhat = xmu * _per_channel(invstd)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.n, ctx.affine = n, weight is not None
        return xhat * _per_channel(weight) + _per_channel(bias) if weight is not None else xhat

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        xhat, weight, invstd = ctx.saved_tensors
        c = dy.shape[1]
        sum_dy = dy.sum(_DIMS)
        sum_dy_xhat = (dy * xhat).sum(_DIMS)
        both = torch.cat([sum_dy, sum_dy_xhat])
        tdist.all_reduce(both)
        scale = invstd * weight if weight is not None else invstd
        dx = (dy - _per_channel(both[:c] / ctx.n) - xhat * _per_channel(both[c:] / ctx.n)) \
            * _per_channel(scale)
        dw, db = (sum_dy_xhat, sum_dy) if ctx.affine else (None, None)
        return dx, dw, db, None, None, None, None


class GlobalBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are those of the global batch (all ranks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and tdist.is_available() and tdist.is_initialized()):
            return super().forward(x)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as nn.BatchNorm2d
                momentum = 1.0 / float(self.num_batches_tracked)
        track = self.track_running_stats and self.running_mean is not None
        return _GlobalBatchNorm.apply(x, self.weight, self.bias,
                                      self.running_mean if track else None,
                                      self.running_var if track else None, self.eps, momentum)


def convert(module: nn.Module) -> nn.Module:
    """Every BatchNorm2d in ``module`` replaced by a GlobalBatchNorm2d holding the same tensors."""
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, GlobalBatchNorm2d):
        new = GlobalBatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                                module.track_running_stats)
        # The very tensors (identity kept), as torch's convert_sync_batchnorm.
        if module.affine:
            new.weight, new.bias = module.weight, module.bias
        new.running_mean, new.running_var = module.running_mean, module.running_var
        new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert(child))
    return module
