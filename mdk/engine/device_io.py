"""Moving data between host and GPU without making either wait."""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch


class CudaPrefetcher:
    """Iterate ``batches`` with each one's tensors already on ``device``: the next batch is copied
    on a side stream while the current step computes. The third item (the sample indices, read on
    the host) stays where it is."""

    def __init__(self, batches: Iterator[Any], device: torch.device) -> None:
        self.batches, self.device = batches, device
        self.stream = torch.cuda.Stream(device)
        self.next = self._load()

    def _load(self) -> Optional[tuple]:
        batch = next(self.batches, None)
        if batch is None:
            return None
        with torch.cuda.stream(self.stream):
            return tuple(x.to(self.device, non_blocking=True)
                         if torch.is_tensor(x) and i != 2 else x
                         for i, x in enumerate(batch))

    def __iter__(self) -> "CudaPrefetcher":
        return self

    def __next__(self) -> tuple:
        batch = self.next
        if batch is None:
            raise StopIteration
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for x in batch:
            if torch.is_tensor(x) and x.is_cuda:
                x.record_stream(current)  # the allocator must not reuse it before the step ends
        self.next = self._load()
        return batch


class DeferredRead:
    """One pending device-to-host read of a small tensor (loss terms, the NaN flag) into pinned
    memory: ``push`` starts it, ``pop`` (one log interval later) returns it and whatever ``push``
    was given alongside, waiting only if it has not finished. On the CPU: a copy at once."""

    def __init__(self) -> None:
        self.pending: Optional[tuple[torch.Tensor, Optional[torch.cuda.Event], Any]] = None

    def push(self, t: torch.Tensor, meta: Any = None) -> None:
        t = t.detach()
        if t.is_cuda:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            buf.copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending = (buf, event, meta)
        else:
            self.pending = (t.clone(), None, meta)

    def pop(self) -> Optional[tuple[torch.Tensor, Any]]:
        if self.pending is None:
            return None
        buf, event, meta = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        return buf, meta
