"""World-size-invariant gradients (``dist.exact_chunk``; how and under which conditions:
docs/distributed.md, "World-size-invariant gradients"): each chunk of c images gets its own
gradient, and the chunk gradients are added one at a time in global order
(``mdk.dist.ordered_sum``), so every split of a batch gives the same bits.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Callable

import torch

from mdk import dist
from mdk.errors import ConfigError

log = logging.getLogger(__name__)
ForwardBackward = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


def prepare(model: torch.nn.Module, chunk: int) -> None:
    """Refuse what would make chunk gradients depend on the split; make cuDNN pick the same
    (deterministic) kernels in every process."""
    bn = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if bn:
        raise ConfigError(
            f"dist.exact_chunk needs a model without BatchNorm in training, but {len(bn)} BatchNorm "
            f"layers are there (e.g. {bn[0]}): each chunk would normalise with its own statistics. "
            "Use model.net.batch_norm=false, or a stage after step1 (BN is folded from step2 on), "
            "or dist.exact_chunk=null")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    log.info("dist.exact_chunk=%d: world-size-invariant gradients (chunks of %d images, added in "
             "global order); %d CPU threads here: compare runs with the same dist.cpu_threads",
             chunk, chunk, torch.get_num_threads())


def chunked_forward_backward(model: torch.nn.Module, forward_backward: ForwardBackward,
                             images: torch.Tensor, targets: torch.Tensor,
                             chunk: int, world_size: int = 1) -> dict[str, torch.Tensor]:
    """Leave the global-batch gradient in ``p.grad`` (same bits for every split); return the
    loss terms averaged over this rank's chunks. Every rank holds as many chunks as this one."""
    params = [p for p in model.parameters() if p.requires_grad]
    parts: list[torch.Tensor] = []
    sums: dict[str, torch.Tensor] = {}
    # DDP must not all-reduce each chunk: the reduction below replaces it.
    no_sync = model.no_sync() if isinstance(model, torch.nn.parallel.DistributedDataParallel) \
        else nullcontext()
    with no_sync:
        for lo in range(0, images.shape[0], chunk):
            for p in params:
                p.grad = None
            # Fresh copies: a chunk's memory starts aligned the same way in every split.
            terms = forward_backward(images[lo:lo + chunk].clone(), targets[lo:lo + chunk].clone())
            parts.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                                    .reshape(-1) for p in params]))
            for k, v in terms.items():
                v = v.detach()
                sums[k] = v if k not in sums else sums[k] + v
    total = dist.ordered_sum(parts).div_(len(parts) * world_size)
    offset = 0
    for p in params:
        p.grad = total[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    return {k: v / len(parts) for k, v in sums.items()}
