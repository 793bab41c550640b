"""The sink interface, its null object and the fan-out to several sinks."""
from __future__ import annotations

import logging
from typing import Mapping

import torch

log = logging.getLogger(__name__)


class NullSink:
    """Logs nothing. Every sink has these methods; ``step`` is the pipeline's global step (it
    continues across the stages of one pipeline, so stages never overlap on the x axis)."""

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """Scalars ``{tag: value}``, e.g. ``loss/total``; the sink separates the stages."""

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        """A uint8 ``[3, H, W]`` image (a detection grid, a PR-curve figure)."""

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Markdown text (e.g. the per-class AP table of ``mdk.eval.ap_table``)."""

    def close(self) -> None:
        """Flush and release; called once when the stage ends (also on error)."""


def check_image(tag: str, image: torch.Tensor) -> torch.Tensor:
    if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"log_image({tag!r}): expected a uint8 [3, H, W] tensor, got "
                         f"{image.dtype} {tuple(image.shape)}")
    return image.detach().cpu()


class MultiSink(NullSink):
    """Every call goes to each sink in order; ``close`` closes them all even if one fails."""

    def __init__(self, sinks: list[NullSink]) -> None:
        self.sinks = sinks

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for s in self.sinks:
            s.log(scalars, step)

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        for s in self.sinks:
            s.log_image(tag, image, step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        for s in self.sinks:
            s.log_text(tag, text, step)

    def close(self) -> None:
        errors = []
        for s in self.sinks:
            try:
                s.close()
            except Exception as e:  # one sink failing to flush must not lose the others
                log.warning("closing %s failed: %s", type(s).__name__, e)
                errors.append(e)
        if errors:
            raise errors[0]
