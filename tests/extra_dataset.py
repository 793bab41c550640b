"""A Dataset class outside mdk, named by ``dataset.reader._target_`` in tests: the VOC-layout
reader limited to the first ``limit`` images of each split (a user's own reader would look so)."""
from __future__ import annotations

from typing import Any

from mdk.data.dataset import DetectionDataset


class FirstImages(DetectionDataset):
    def __init__(self, limit: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.entries, self._boxes = self.entries[:limit], self._boxes[:limit]
        if self.images is not None:
            self.images = self.images[:limit]
