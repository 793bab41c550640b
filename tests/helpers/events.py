"""TensorBoard event files read back."""
from __future__ import annotations

from pathlib import Path


def read_events(logdir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    ea.Reload()
    return ea
