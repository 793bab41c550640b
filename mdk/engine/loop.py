"""The one training loop, with hooks (after detectron2's train_loop.py).

The loop only moves data, runs forward/backward/step and calls hooks; checkpointing, evaluation,
LR stepping, metrics, progress and NaN guarding are hooks. Stages never subclass the loop: what a
stage changes (quantization flags, calibration, export) is decided before the loop starts.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Callable, Iterable, Optional

import torch

from mdk.engine.device_io import CudaPrefetcher
from mdk.engine.exact_grad import chunked_forward_backward, prepare


class HookBase:
    trainer: "Trainer"

    def before_train(self) -> None: ...
    def before_epoch(self) -> None: ...
    def before_step(self) -> None: ...
    def after_backward(self) -> None: ...
    def after_step(self) -> None: ...
    def after_epoch(self) -> None: ...
    def after_train(self) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Trainer:
    """Runs epochs ``[start_epoch, epochs)``; state lives in attributes hooks may read."""

    def __init__(self, model: torch.nn.Module, loss_fn: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, loader: Iterable, device: torch.device,
                 epochs: int, iters_per_epoch: int,
                 grad_clip: Optional[float] = None, exact_chunk: Optional[int] = None,
                 amp_dtype: Optional[torch.dtype] = None,
                 batch_transform: Optional[Callable[[torch.Tensor, Any], torch.Tensor]] = None,
                 channels_last: bool = False, world_size: int = 1) -> None:
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        # dist.exact_chunk: world-size-invariant gradients, the sum over all World.size ranks
        self.exact_chunk, self.world_size = exact_chunk, world_size
        if exact_chunk:
            prepare(model, exact_chunk)
        self.loader, self.device = loader, device
        self.epochs, self.iters_per_epoch = epochs, iters_per_epoch
        self.grad_clip = grad_clip
        # On the device, after the copy: e.g. mdk.data.augment.BatchAugment(images, index)
        self.batch_transform = batch_transform
        self.channels_last = channels_last  # trainer.channels_last: NHWC inputs (and weights)
        self.hooks: list[HookBase] = []
        self.epoch = 0            # current epoch (0-based)
        self.iter = 0             # optimizer steps done so far (global, across epochs)
        self.batch_in_epoch = 0   # batches done in the current epoch
        self.loss_terms: dict[str, torch.Tensor] = {}
        self.stop = False
        self.stop_reason: Optional[str] = None  # why a hook ended training early (the result says)
        self.skip_step = False
        self.data_wait_s = 0.0
        # ``amp_dtype``: None is float32. float16 needs a GradScaler against gradient underflow;
        # bfloat16 has float32's exponent range.
        self.amp_dtype: Optional[torch.dtype] = amp_dtype
        self.scaler: Optional[torch.amp.GradScaler] = (
            torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None)

    def state_dict(self) -> dict[str, int]:
        """Where the loop is (the training sampler's position follows from it)."""
        return {"epoch": self.epoch, "iter": self.iter}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.iter = int(state["iter"])  # train() derives the epoch and the batch in it

    def register_hooks(self, hooks: list[Optional[HookBase]]) -> None:
        for h in hooks:
            if h is not None:
                h.trainer = self
                self.hooks.append(h)

    def _call(self, name: str) -> None:
        for h in self.hooks:
            getattr(h, name)()

    @property
    def start_batch(self) -> int:
        return self.iter - self.epoch * self.iters_per_epoch

    def train(self) -> None:
        self.epoch = self.iter // self.iters_per_epoch
        self._call("before_train")
        try:
            while self.epoch < self.epochs and not self.stop:
                self.batch_in_epoch = self.start_batch
                self._call("before_epoch")
                self.model.train()
                self.data_wait_s = 0.0  # host time blocked on the loader this epoch
                batches = iter(self.loader)
                if self.device.type == "cuda":  # the next batch's copy overlaps this step
                    batches = CudaPrefetcher(batches, self.device)
                while True:
                    t0 = time.perf_counter()
                    batch = next(batches, None)
                    self.data_wait_s += time.perf_counter() - t0
                    if batch is None:
                        break
                    self.run_step(batch)
                    if self.stop:
                        break
                del batches
                self._call("after_epoch")
                self.epoch += 1
        finally:
            self._call("after_train")
            close = getattr(self.loader, "close", None)
            if close is not None:  # persistent loader workers end with the training
                close()

    def forward_backward(self, images: torch.Tensor,
                         targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Loss terms of ``images``; their gradient is added to ``p.grad`` (scaled under fp16)."""
        with (torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype
              else nullcontext()):
            pred = self.model(images)
        terms = self.loss_fn(pred, targets)  # the loss computes in float32 or float64
        loss = terms["total"]
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return terms

    def run_step(self, batch: Any) -> None:
        self._call("before_step")
        images, targets = (x.to(self.device, non_blocking=True) for x in batch[:2])
        if self.batch_transform is not None:
            images = self.batch_transform(images, batch)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        self.optimizer.zero_grad(set_to_none=True)
        if self.exact_chunk:
            self.loss_terms = chunked_forward_backward(self.model, self.forward_backward, images,
                                                       targets, self.exact_chunk, self.world_size)
        else:
            self.loss_terms = self.forward_backward(images, targets)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        self.skip_step = False  # a hook (the NaN guard) may veto this optimizer step
        self._call("after_backward")
        if not self.skip_step:
            if self.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
            else:
                self.optimizer.step()
        if self.scaler is not None:  # after a skipped step too: it closes that step's unscale_
            self.scaler.update()
        self.iter += 1
        self.batch_in_epoch += 1
        self._call("after_step")

