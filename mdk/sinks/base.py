"""The sink interface, its null object and the fan-out to several sinks.

A sink whose method raises OSError (a full, read-only or foreign disk) warns once and writes
nothing more; the run goes on. Every :class:`NullSink` subclass gets this (``__init_subclass__``).
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, ClassVar, Mapping

import torch

from mdk.errors import disk_reason

log = logging.getLogger(__name__)


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: "NullSink", *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            if method.__name__ == "close":  # still release what it holds (files, threads)
                with contextlib.suppress(OSError):
                    method(self, *args, **kwargs)
            return None
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            self.broken = True
            where = getattr(self, "logdir", None) or getattr(e, "filename", None)
            log.warning("%s stopped writing%s: %s (%s); the run goes on without it",
                        type(self).__name__, f" to {where}" if where else "",
                        disk_reason(e) or "a write failed", e)
            return None
    return call


class NullSink:
    """Logs nothing. Every sink has these methods; ``step`` is the pipeline's global step (it
    continues across stages, so they never overlap on the x axis)."""

    broken = False  # set when a write failed: the sink said so once and is silent from then on
    guard_writes: ClassVar[bool] = True  # the fan-out leaves that to each of its sinks

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.guard_writes:
            for name in ("log", "log_image", "log_text", "close"):
                if name in cls.__dict__:
                    setattr(cls, name, _guarded(cls.__dict__[name]))

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

    guard_writes = False

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
