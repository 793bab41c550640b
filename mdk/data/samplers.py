"""Samplers that make a global batch independent of how it is split over ranks (docs/distributed.md,
Semantics); a mid-epoch resume skips the global batches already done.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler

from mdk.dist_config import check_batch_divides
from mdk.errors import DataError


class GlobalBatchSampler(Sampler[list[int]]):
    def __init__(self, num_samples: int, global_batch: int, rank: int, world: int, seed: int,
                 shuffle: bool = True, limit_batches: int | None = None) -> None:
        check_batch_divides(global_batch, world)
        self.n, self.B, self.rank, self.world = num_samples, global_batch, rank, world
        self.local = global_batch // world
        self.seed, self.shuffle = seed, shuffle
        full = num_samples // global_batch  # drop the last partial global batch
        if full == 0:
            raise DataError(f"the training split has {num_samples} images, fewer than one global "
                             f"batch (trainer.batch_size={global_batch}); lower the batch size")
        self.num_batches = min(full, limit_batches) if limit_batches else full
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        return self.num_batches - self.start_batch

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            perm = torch.randperm(self.n, generator=g).tolist()
        else:
            perm = list(range(self.n))
        for b in range(self.start_batch, self.num_batches):
            lo = b * self.B + self.rank * self.local
            yield perm[lo: lo + self.local]


class ShardSampler(Sampler[int]):
    """Evaluation shard without padding: rank r gets r, r+W, r+2W, ..."""

    def __init__(self, num_samples: int, rank: int, world: int, limit: int | None = None) -> None:
        n = min(num_samples, limit) if limit else num_samples
        self.indices = list(range(rank, n, world))

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)


class EpochTagged(Sampler[list[tuple[int, int]]]):
    """The batches of a GlobalBatchSampler as ``(epoch, index)`` keys, so persistent loader
    workers augment each sample for its epoch."""

    def __init__(self, sampler: GlobalBatchSampler) -> None:
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.sampler.epoch
        for batch in self.sampler:
            yield [(epoch, i) for i in batch]
