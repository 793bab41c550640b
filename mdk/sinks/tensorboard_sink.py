"""TensorBoard: one event folder per stage, ``<run_dir>/tensorboard/<stage>``.

A folder per stage makes each stage a TensorBoard "run": the stages are separately coloured
curves of the same tags, one after the other (a tag prefix in one folder would split the charts,
and a purge on one stage's resume would drop the later stages' steps).
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from mdk.sinks.base import NullSink, check_image

log = logging.getLogger(__name__)


def _quiet_writer_thread() -> None:
    """Silence OSErrors in TensorBoard's writer thread: they come back from the sink's next call,
    which warns once (mdk/sinks/base.py), instead of a thread traceback."""
    prev = threading.excepthook
    if getattr(prev, "mdk_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and \
                isinstance(args.exc_value, OSError):
            return
        prev(args)

    hook.mdk_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class TensorBoardSink(NullSink):
    def __init__(self, *, run_dir: Path, stage: str, group: Optional[str] = None,
                 resume_step: Optional[int] = None, config: Optional[Mapping[str, Any]] = None,
                 subdir: str = "tensorboard", flush_secs: int = 30) -> None:
        # here: tensorboard's writer imports its protobuf stack, ~1 s, only when this sink is on
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = Path(run_dir) / subdir / stage
        _quiet_writer_thread()
        purge = None if resume_step is None else int(resume_step) + 1
        self.w = SummaryWriter(str(self.logdir), purge_step=purge, flush_secs=flush_secs)
        log.info("TensorBoard events of %s in %s%s", stage, self.logdir,
                 f" (steps >= {purge} of the interrupted run discarded)" if purge else "")

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.w.add_scalar(k, float(v), int(step))

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        self.w.add_image(tag, check_image(tag, image), int(step), dataformats="CHW")

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.w.add_text(tag, text, int(step))

    def close(self) -> None:
        self.w.close()
