"""Build the metric sinks of ``conf/logger/*.yaml``. Off (or not rank 0) means a null object, so
the engine never asks "is logging on?" (a new sink: README, "Extending mdk")."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Mapping, Optional

from mdk.targets import build
from mdk.errors import disk_reason
from mdk.sinks.base import MultiSink, NullSink
from mdk.sinks.config import sink_nodes

log = logging.getLogger(__name__)


def build_sinks(logger_cfg: Any, run_dir: str | Path, config: Mapping[str, Any], is_main: bool,
                *, stage: Optional[str] = None, group: Optional[str] = None,
                resume_step: Optional[int] = None) -> NullSink:
    """The sinks of ``logger_cfg.sinks`` for one stage, or a :class:`NullSink`.

    - ``run_dir``: the job's output folder; sinks write under it.
    - ``config``: the resolved run config as a plain dict (recorded by wandb).
    - ``is_main``: False on ranks other than 0, which then get a NullSink.
    - ``stage``: the stage logging; TensorBoard and wandb keep one run per stage. Default:
      ``config["step"]["name"]``.
    - ``group``: the sweep this job belongs to, None for a single run.
    - ``resume_step``: the global step of the checkpoint this stage resumes from, None when it
      starts fresh; TensorBoard discards this stage's events after it (they are redone).

    A node's error raises ``ConfigError`` naming ``logger.sinks.<name>``.
    """
    if not is_main:
        return NullSink()
    if stage is None:
        stage = str((config.get("step") or {}).get("name") or "train")
    sinks: list[NullSink] = []
    try:
        for where, node, hint in sink_nodes(logger_cfg):
            try:
                sinks.append(build(node, where, hint=hint, run_dir=Path(run_dir), stage=stage,
                                   group=group, resume_step=resume_step, config=config))
            except OSError as e:  # its folder takes no file: a warning, the run goes on
                log.warning("%s could not start: %s (%s); the run goes on without it", where,
                            disk_reason(e) or "a write failed", e)
    except BaseException:
        with contextlib.suppress(Exception):  # each failure is warned; the first error wins
            MultiSink(sinks).close()  # release the sinks already made (wandb runs, event files)
        raise
    if not sinks:
        return NullSink()
    return sinks[0] if len(sinks) == 1 else MultiSink(sinks)

